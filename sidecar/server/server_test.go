package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
	"github.com/vfnet-io/vfnet/sidecar/server"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
)

func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func q35(t testing.TB) []byte { return sidecartest.ReadFile(t, "../domain/testdata/q35.xml") }

func vmiJSON(t testing.TB, vmi *kubevirtv1.VirtualMachineInstance) []byte {
	t.Helper()
	b, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type running struct {
	srv   *server.Server
	conn  *grpc.ClientConn
	info  info.InfoClient
	cb    v1alpha3.CallbacksClient
	done  chan error
	stop  context.CancelFunc
	dir   string
	mroot string
}

func start(t *testing.T, reader func(root string) metadataReader) *running {
	t.Helper()
	return startCtx(t, context.Background(), reader)
}

func startCtx(t *testing.T, parent context.Context, reader func(root string) metadataReader) *running {
	t.Helper()
	r := &running{dir: shortDir(t), mroot: t.TempDir(), done: make(chan error, 1)}
	var rd metadataReader = metadata.FileReader{Root: r.mroot}
	if reader != nil {
		rd = reader(r.mroot)
	}
	ctx, cancel := context.WithCancel(parent)
	r.stop = cancel
	srv, err := server.New(ctx, server.Config{SocketDir: r.dir, BindingName: sidecartest.Binding, Reader: rd})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	go func() { r.done <- srv.Serve(ctx) }()
	conn, err := grpc.NewClient("unix://"+srv.Path(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn, r.info, r.cb = conn, info.NewInfoClient(conn), v1alpha3.NewCallbacksClient(conn)
	t.Cleanup(func() { conn.Close(); cancel(); <-r.done })
	return r
}

type metadataReader interface {
	Read(kubevirtvmi.ClaimInterface) (*metadata.Device, error)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // virt-launcher's deadline
	t.Cleanup(cancel)
	return ctx
}

func TestServeOverSocket(t *testing.T) {
	t.Parallel()
	r := start(t, nil)
	ctx := callCtx(t)
	if got, want := r.srv.Path(), filepath.Join(r.dir, "vfnet-vfnet.sock"); got != want {
		t.Errorf("socket %s, want %s", got, want)
	}

	inf, err := r.info.Info(ctx, &info.InfoParams{})
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, p := range inf.GetHookPoints() {
		points = append(points, p.GetName())
	}
	if inf.GetName() != "vfnet" || strings.Join(inf.GetVersions(), ",") != "v1alpha3" || strings.Join(points, ",") != "OnDefineDomain,Shutdown" {
		t.Errorf("Info = %v", inf)
	}

	sidecartest.WriteVF(t, r.mroot, "net", "vf", "0000:3b:02.1", "02:00:00:00:00:01")
	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02:00:00:00:00:01" }).Build()
	in := q35(t)
	res, err := r.cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: in, Vmi: vmiJSON(t, vmi)})
	if err != nil {
		t.Fatal(err)
	}
	block := sidecartest.Insertion(t, in, res.GetDomainXML())
	if !strings.Contains(string(block), `<alias name="ua-sriov-dra-net">`) {
		t.Errorf("inserted %s", block)
	}
	sidecartest.Validate(t, res.GetDomainXML())

	pre, err := r.cb.PreCloudInitIso(ctx, &v1alpha3.PreCloudInitIsoParams{CloudInitNoCloudSource: []byte(`{"userData":"x"}`), Vmi: []byte("{}"), CloudInitData: []byte(`{"dataSource":"NoCloud"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if string(pre.GetCloudInitNoCloudSource()) != `{"userData":"x"}` || string(pre.GetCloudInitData()) != `{"dataSource":"NoCloud"}` {
		t.Errorf("PreCloudInitIso changed its input: %v", pre)
	}

	// Nothing but our socket in the directory virt-launcher scans.
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "vfnet-vfnet.sock" {
		t.Errorf("socket dir holds %v", ents)
	}

	if _, err := r.cb.Shutdown(ctx, &v1alpha3.ShutdownParams{}); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Serve after Shutdown: %v", err)
	}
	r.done <- nil // for cleanup
	if _, err := os.Stat(r.srv.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Shutdown: %v", err)
	}
}

func TestErrorCodes(t *testing.T) {
	t.Parallel()
	r := start(t, nil)
	ctx := callCtx(t)
	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build()
	cases := []struct {
		name string
		p    *v1alpha3.OnDefineDomainParams
		code codes.Code
		want []string
	}{
		{"bad VMI JSON", &v1alpha3.OnDefineDomainParams{DomainXML: q35(t), Vmi: []byte(`{"spec":`)}, codes.InvalidArgument, []string{"VMI JSON"}},
		{"no VMI", &v1alpha3.OnDefineDomainParams{DomainXML: q35(t)}, codes.InvalidArgument, []string{"no VMI"}},
		{"bad domain XML", &v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain>"), Vmi: vmiJSON(t, vmi)}, codes.InvalidArgument, []string{"not well-formed"}},
		{"metadata missing", &v1alpha3.OnDefineDomainParams{DomainXML: q35(t), Vmi: vmiJSON(t, vmi)}, codes.FailedPrecondition,
			[]string{`interface "dra-net"`, `claim "net"`, `request "vf"`, metadata.TemplateClaimPath(r.mroot, "net", "vf"), "upgrade KubeVirt"}},
	}
	for _, c := range cases {
		_, err := r.cb.OnDefineDomain(ctx, c.p)
		if status.Code(err) != c.code {
			t.Errorf("%s: code %v (%v), want %v", c.name, status.Code(err), err, c.code)
		}
		for _, w := range c.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: message does not mention %q: %v", c.name, w, err)
			}
		}
	}
}

// On a migration target an error would abort the target's preparation while
// the result is thrown away anyway: the input comes back unchanged.
func TestMigrationTargetNeverFails(t *testing.T) {
	t.Parallel()
	r := start(t, nil)
	ctx := callCtx(t)
	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build()
	vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{TargetPod: "virt-launcher-vm-a-tgt", TargetNode: "node-2", SourceNode: "node-1"}
	in := q35(t)
	res, err := r.cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: in, Vmi: vmiJSON(t, vmi)})
	if err != nil {
		t.Fatalf("migration target: %v", err)
	}
	if string(res.GetDomainXML()) != string(in) {
		t.Errorf("migration target: domain changed")
	}
	// After the migration the same VMI is an ordinary one again.
	vmi.Status.MigrationState.Completed = true
	if _, err := r.cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: in, Vmi: vmiJSON(t, vmi)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("completed migration: %v, want FailedPrecondition", err)
	}
}

func TestIsMigrationTarget(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		ms   *kubevirtv1.VirtualMachineInstanceMigrationState
		want bool
	}{
		"none":          {nil, false},
		"in progress":   {&kubevirtv1.VirtualMachineInstanceMigrationState{TargetPod: "p"}, true},
		"decentralized": {&kubevirtv1.VirtualMachineInstanceMigrationState{TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Pod: "p"}}}, true},
		"completed":     {&kubevirtv1.VirtualMachineInstanceMigrationState{TargetPod: "p", Completed: true}, false},
		"failed":        {&kubevirtv1.VirtualMachineInstanceMigrationState{TargetPod: "p", Failed: true}, false},
		"no target yet": {&kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n"}, false},
	} {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		vmi.Status.MigrationState = c.ms
		if got := kubevirtvmi.View(vmi).MigrationTarget(); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}

type panicReader struct{}

func (panicReader) Read(kubevirtvmi.ClaimInterface) (*metadata.Device, error) { panic("boom") }

func TestPanicBecomesInternalError(t *testing.T) {
	t.Parallel()
	r := start(t, func(string) metadataReader { return panicReader{} })
	ctx := callCtx(t)
	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build()
	_, err := r.cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: q35(t), Vmi: vmiJSON(t, vmi)})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "boom") {
		t.Errorf("err = %v, want Internal naming the panic", err)
	}
	if _, err := r.info.Info(ctx, &info.InfoParams{}); err != nil {
		t.Errorf("server gone after a panic: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	t.Parallel()
	dir := shortDir(t)
	path := server.SocketPath(dir, "vfnet")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // a crashed sidecar's leftover
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, server.Config{SocketDir: dir, BindingName: "vfnet", Reader: metadata.FileReader{Root: dir}})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}

	if err := os.WriteFile(path, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := server.New(context.Background(), server.Config{SocketDir: dir, BindingName: "vfnet", Reader: metadata.FileReader{Root: dir}}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file at the socket path: err = %v", err)
	}
}

func TestBadBindingName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "a/b", "..", strings.Repeat("x", 120)} {
		if _, err := server.New(context.Background(), server.Config{SocketDir: shortDir(t), BindingName: name, Reader: metadata.FileReader{}}); err == nil {
			t.Errorf("binding name %q accepted", name)
		}
	}
}

// TestEveryCallLogsItsDuration: the sidecar has no metrics server (it runs
// in every VM pod); each hook call is logged with its duration at the
// default verbosity instead.
func TestEveryCallLogsItsDuration(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{Verbosity: 0})
	r := startCtx(t, klog.NewContext(context.Background(), logger), nil)
	ctx := callCtx(t)
	if _, err := r.info.Info(ctx, &info.InfoParams{}); err != nil {
		t.Fatal(err)
	}
	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build()
	if _, err := r.cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: q35(t), Vmi: vmiJSON(t, vmi)}); err == nil {
		t.Fatal("OnDefineDomain without metadata succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, method := range []string{"/kubevirt.hooks.info.Info/Info", "/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain"} {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, `"method"="`+method+`"`) && strings.Contains(l, `"duration"=`)
		}
		if !found {
			t.Errorf("no line with the duration of %s at the default verbosity; log %q", method, lines)
		}
	}
}
