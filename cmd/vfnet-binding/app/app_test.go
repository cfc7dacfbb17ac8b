package app_test

import (
	"io"
	"testing"

	"github.com/vfnet-io/vfnet/cmd/vfnet-binding/app"
)

func TestParse(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	o, err := app.Parse(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.SocketDir != "/var/run/kubevirt-hooks" || o.MetadataRoot != "/var/run/kubernetes.io/dra-device-attributes" || o.BindingName != "vfnet" {
		t.Errorf("defaults %+v", o)
	}
	env[app.BindingNameEnv] = "fastnet"
	o, err = app.Parse([]string{"--socket-dir=/s", "--metadata-root", "/m"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o != (app.Options{SocketDir: "/s", MetadataRoot: "/m", BindingName: "fastnet"}) {
		t.Errorf("parsed %+v", o)
	}
	if _, err := app.Parse([]string{"extra"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("stray argument accepted")
	}
	if _, err := app.Parse([]string{"--nope"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("unknown flag accepted")
	}
}

func TestGCPercent(t *testing.T) {
	t.Parallel()
	if pct, ok := app.GCPercent(func(string) string { return "" }); !ok || pct != app.DefaultGCPercent {
		t.Errorf("GOGC unset: GCPercent = %d, %v; want %d, true", pct, ok, app.DefaultGCPercent)
	}
	if _, ok := app.GCPercent(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}); ok {
		t.Error("GOGC=200 set: GCPercent overrides it")
	}
}
