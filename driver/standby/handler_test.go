package standby

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// fakePlumber records calls and fails Attach for the interfaces in fail.
type fakePlumber struct {
	mu       sync.Mutex
	attached []Attachment
	detached []string
	kept     []map[string]bool
	fail     map[string]error
}

func (f *fakePlumber) Attach(_ context.Context, a Attachment) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[a.Interface]; err != nil {
		return err
	}
	f.attached = append(f.attached, a)
	return nil
}

func (f *fakePlumber) Detach(_ context.Context, uid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.detached = append(f.detached, uid)
	return nil
}

func (f *fakePlumber) Prune(_ context.Context, keep map[string]bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kept = append(f.kept, keep)
	return nil
}

const selfNetns = "/proc/self/ns/net" // a real namespace file

func launcher(uid, nsPath string) *api.PodSandbox {
	return &api.PodSandbox{Uid: uid, Namespace: "vms", Name: "virt-launcher-" + uid,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "ipc"}, {Type: "network", Path: nsPath}}}}
}

func newHandler(p Plumber) *Handler {
	return &Handler{Plumber: p, ProcRoot: "/proc", Wanted: func(uid string) []Want {
		switch uid {
		case "failover":
			return []Want{{Interface: "physnet-a", Bridge: "br-a", Claim: "vms/vm-vf"}, {Interface: "physnet-b", Bridge: "br-b", Claim: "vms/vm-vf"}}
		case "broken":
			return []Want{{Interface: "bad", Bridge: "br-x", Claim: "vms/vm-bad"}}
		}
		return nil
	}}
}

func TestRunPodSandboxPlumbsPreparedStandbys(t *testing.T) {
	f := &fakePlumber{}
	h := newHandler(f)
	if err := h.RunPodSandbox(t.Context(), launcher("failover", selfNetns)); err != nil {
		t.Fatal(err)
	}
	want := []Attachment{
		{PodUID: "failover", Netns: selfNetns, Interface: "physnet-a", Bridge: "br-a"},
		{PodUID: "failover", Netns: selfNetns, Interface: "physnet-b", Bridge: "br-b"},
	}
	if !slices.Equal(f.attached, want) {
		t.Fatalf("attached %+v, want %+v", f.attached, want)
	}
	// A pod without failover claims is not touched.
	if err := h.RunPodSandbox(t.Context(), launcher("plain", selfNetns)); err != nil || len(f.attached) != 2 {
		t.Fatalf("plain pod: %v, attached %d", err, len(f.attached))
	}
}

// A failure fails the sandbox with a message naming the interface, the
// tap, the bridge and the fix.
func TestRunPodSandboxFailureNamesTheFix(t *testing.T) {
	f := &fakePlumber{fail: map[string]error{"bad": errors.New("node bridge br-x: Link not found")}}
	err := newHandler(f).RunPodSandbox(t.Context(), launcher("broken", selfNetns))
	if err == nil {
		t.Fatal("no error")
	}
	tap := NamesFor(Attachment{Interface: "bad"}).Tap
	for _, want := range []string{`interface "bad"`, "vms/virt-launcher-broken", "vms/vm-bad", tap, "br-x", "Link not found", "pfs[].standby.bridge", "remove VFConfig.failover"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// A host-network pod cannot hold a standby.
	hostNet := launcher("failover", "")
	err = newHandler(&fakePlumber{}).RunPodSandbox(t.Context(), hostNet)
	if err == nil || !strings.Contains(err.Error(), "no network namespace of its own") {
		t.Errorf("hostNetwork pod: %v", err)
	}
}

// The runtime's namespace path may not be visible in the driver's mount
// namespace (an empty file where the bind mount did not propagate): the
// sandbox process's namespace under ProcRoot is used instead.
func TestPodNetnsFallsBackToSandboxProcess(t *testing.T) {
	notNs := filepath.Join(t.TempDir(), "cni-1234")
	if err := os.WriteFile(notNs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f := &fakePlumber{}
	h := newHandler(f)
	pod := launcher("failover", notNs)
	if err := h.RunPodSandbox(t.Context(), pod); err == nil || !strings.Contains(err.Error(), notNs) {
		t.Fatalf("no pid: %v, want an error naming %s", err, notNs)
	}
	pod.Pid = uint32(os.Getpid())
	if err := h.RunPodSandbox(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if want := "/proc/" + strconv.Itoa(os.Getpid()) + "/ns/net"; len(f.attached) == 0 || f.attached[0].Netns != want {
		t.Fatalf("attached %+v, want netns %s", f.attached, want)
	}
}

func TestStopRemoveDetachAndSynchronizePrunes(t *testing.T) {
	f := &fakePlumber{}
	h := newHandler(f)
	synced := 0
	h.OnSync = func() { synced++ }
	for _, ev := range []func(context.Context, *api.PodSandbox) error{h.StopPodSandbox, h.RemovePodSandbox} {
		if err := ev(t.Context(), launcher("failover", selfNetns)); err != nil {
			t.Fatal(err)
		}
		if err := ev(t.Context(), launcher("plain", selfNetns)); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(f.detached, []string{"failover", "failover"}) {
		t.Errorf("detached %v, want the failover pod at stop and at remove only", f.detached)
	}
	pods := []*api.PodSandbox{launcher("failover", selfNetns), launcher("plain", selfNetns), launcher("broken", selfNetns)}
	f.fail = map[string]error{"bad": errors.New("boom")}
	if _, err := h.Synchronize(t.Context(), pods, nil); err != nil {
		t.Fatalf("Synchronize: %v (one pod's failure must not fail the others)", err)
	}
	if len(f.attached) != 2 {
		t.Errorf("Synchronize attached %+v, want the failover pod's two standbys", f.attached)
	}
	if len(f.kept) != 1 || len(f.kept[0]) != 3 || !f.kept[0]["plain"] {
		t.Errorf("Prune kept %v, want the three running pods", f.kept)
	}
	if synced != 1 {
		t.Errorf("OnSync called %d times", synced)
	}
}

// The glue against NRI's own runtime side (pkg/adaptation, which
// containerd and CRI-O embed): the plugin registers, a RunPodSandbox
// error reaches the runtime (which fails the sandbox with it), and after
// the runtime restarts the plugin connects again and resynchronizes. The
// plugin dials a relay in front of the runtime's socket: closing the
// relayed connections is what a runtime process's exit does to them
// (adaptation.Stop alone leaves external plugins connected).
func TestNRIAgainstRuntime(t *testing.T) {
	dir := t.TempDir()
	f := &fakePlumber{fail: map[string]error{"bad": errors.New("boom")}}
	rl := newRelay(t, filepath.Join(dir, "nri.sock"))
	n := &NRI{Socket: rl.path, Handler: newHandler(f)}
	if err := n.ErrNotConnected(); !strings.Contains(err.Error(), "[plugins.'io.containerd.nri.v1.nri']") || !strings.Contains(err.Error(), rl.path) {
		t.Errorf("ErrNotConnected = %v, want the containerd section and the socket", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	// Started before the runtime listens: it keeps retrying.
	go func() { n.Run(ctx); close(done) }()

	gen := 0
	startRuntime := func(pods []*api.PodSandbox) *adaptation.Adaptation {
		t.Helper()
		gen++
		sock := filepath.Join(dir, "runtime"+strconv.Itoa(gen)+".sock")
		r, err := adaptation.New("test-runtime", "v0",
			func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, pods, nil); return err },
			func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
				return nil, nil
			},
			adaptation.WithSocketPath(sock), adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
			adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		rl.target(sock)
		waitFor(t, "the plugin to connect", n.Connected)
		// The plugin sees Synchronize before the runtime adds it to the
		// plugins it sends pod events to; the runtime's sync block, held
		// for the whole registration, waits for that.
		r.BlockPluginSync().Unblock()
		return r
	}
	r := startRuntime(nil)
	if err := r.RunPodSandbox(t.Context(), &adaptation.RunPodSandboxRequest{Pod: launcher("failover", selfNetns)}); err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	if len(f.attached) != 2 {
		t.Fatalf("attached %+v", f.attached)
	}
	err := r.RunPodSandbox(t.Context(), &adaptation.RunPodSandboxRequest{Pod: launcher("broken", selfNetns)})
	if err == nil || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), `interface "bad"`) {
		t.Fatalf("RunPodSandbox of a pod whose standby fails = %v, want the plugin's error", err)
	}
	if err := r.StopPodSandbox(t.Context(), &adaptation.StopPodSandboxRequest{Pod: launcher("failover", selfNetns)}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.detached, []string{"failover"}) {
		t.Errorf("detached %v", f.detached)
	}

	// The runtime restarts: the plugin reconnects, and Synchronize plumbs
	// the running failover pod and prunes the rest.
	r.Stop()
	rl.drop()
	waitFor(t, "the plugin to see the drop", func() bool { return !n.Connected() })
	f.mu.Lock()
	f.attached, f.kept = nil, nil
	f.mu.Unlock()
	r = startRuntime([]*api.PodSandbox{launcher("failover", selfNetns)})
	defer r.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.attached) != 2 || len(f.kept) != 1 || !f.kept[0]["failover"] {
		t.Errorf("after reconnecting: attached %+v, kept %v", f.attached, f.kept)
	}
}

// relay listens on path and forwards each connection to the current
// target socket; drop closes every relayed connection.
type relay struct {
	path  string
	mu    sync.Mutex
	to    string
	conns []net.Conn
}

func newRelay(t *testing.T, path string) *relay {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay{path: path}
	t.Cleanup(func() { l.Close(); rl.drop() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			rl.mu.Lock()
			to := rl.to
			rl.mu.Unlock()
			if to == "" {
				c.Close() // no runtime yet: as a refused connection
				continue
			}
			up, err := net.Dial("unix", to)
			if err != nil {
				c.Close()
				continue
			}
			rl.mu.Lock()
			rl.conns = append(rl.conns, c, up)
			rl.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return rl
}

func (rl *relay) target(sock string) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.to = sock
}

func (rl *relay) drop() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for _, c := range rl.conns {
		c.Close()
	}
	rl.conns, rl.to = nil, ""
}

// waitFor polls cond; the bound is generous and only ends a hung test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
