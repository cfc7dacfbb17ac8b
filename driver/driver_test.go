package driver_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vfnet-io/vfnet/driver"
)

func validConfig() driver.Config {
	return driver.Config{NodeName: "n", ResyncInterval: time.Second, HealthInterval: time.Second,
		VFCountRetryInterval: time.Second, ClaimsListTimeout: time.Second}
}

// TestNewRefusesBadConfig: every mistake is reported by New, naming the
// flag to fix, before anything touches the host or the API server.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	broken := filepath.Join(t.TempDir(), "node-config.yaml")
	if err := os.WriteFile(broken, []byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs: [{}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	full := func(c driver.Config) driver.Config {
		c.Host = &driver.Host{}
		c.Kube = fake.NewClientset()
		c.Dynamic = dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*driver.Config)
		want string
	}{
		{"no node", func(c *driver.Config) { c.NodeName = "" }, "--node-name"},
		{"zero rescan", func(c *driver.Config) { c.ResyncInterval = 0 }, "--resync-interval"},
		{"negative list timeout", func(c *driver.Config) { c.ClaimsListTimeout = -time.Second }, "--claims-list-timeout"},
		{"missing config file", func(c *driver.Config) { c.ConfigPath = filepath.Join(t.TempDir(), "none.yaml") }, "none.yaml"},
		{"broken config file", func(c *driver.Config) { c.ConfigPath = broken }, "pfs[0]"},
		{"no host", func(c *driver.Config) { c.Host = nil }, "Host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := full(validConfig())
			tc.edit(&c)
			_, err := driver.New(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := driver.New(full(validConfig())); err != nil {
		t.Fatalf("New with a valid configuration: %v", err)
	}
}
