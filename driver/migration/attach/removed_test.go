package attach_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
)

// launcherWithVFs serves a fake launcher libvirt whose running domain holds
// one hostdev per interface, on VFs 0000:3b:02.<i+1>.
func launcherWithVFs(tb testing.TB, pods string, ifaces ...string) *libvirtfake.Server {
	tb.Helper()
	rd := attach.RuntimeDir(pods, podUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		tb.Fatal(err)
	}
	srv, err := libvirtfake.Listen(rd)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunning(domainXML); err != nil {
		tb.Fatal(err)
	}
	for i, iface := range ifaces {
		x, err := attach.Hostdev{Interface: iface, Source: pciaddr.Address{Bus: 0x3b, Slot: 2, Function: uint(i + 1)}}.XML()
		if err != nil {
			tb.Fatal(err)
		}
		if err := srv.Plug(testDomain, x); err != nil {
			tb.Fatal(err)
		}
	}
	return srv
}

func waitSubscribed(tb testing.TB, srv *libvirtfake.Server) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for srv.Subscribers() == 0 {
		if time.Now().After(deadline) {
			tb.Fatal("no device-removed subscription within 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWaitRemovedFollowsEvents: with the periodic reread an hour away, only
// libvirt's device-removed events can tell the watch that the source
// launcher detached a VF; each alias is reported once, as it goes.
func TestWaitRemovedFollowsEvents(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := launcherWithVFs(t, pods, "net1", "net2")
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods, Recheck: time.Hour}
	gone := make(chan string, 4)
	done := make(chan error, 1)
	go func() {
		done <- a.WaitRemoved(t.Context(), attach.Removal{PodUID: podUID, Domain: testDomain,
			Aliases: []string{attach.Alias("net1"), attach.Alias("net2")},
			Gone:    func(_ context.Context, alias string) error { gone <- alias; return nil }})
	}()
	waitSubscribed(t, srv)
	select {
	case al := <-gone:
		t.Fatalf("%s reported gone while the domain still has it", al)
	case <-time.After(50 * time.Millisecond):
	}
	for _, iface := range []string{"net2", "net1"} {
		if err := srv.Detach(testDomain, attach.Alias(iface)); err != nil {
			t.Fatal(err)
		}
		select {
		case al := <-gone:
			if al != attach.Alias(iface) {
				t.Fatalf("reported %s gone, want %s", al, attach.Alias(iface))
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s detached, not reported within 30s", iface)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(gone) != 0 {
		t.Errorf("extra reports: %d", len(gone))
	}
}

// TestWaitRemovedAlreadyDetached: a VF detached before the watch started
// (the driver restarted mid-migration) is reported from the first read.
func TestWaitRemovedAlreadyDetached(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	launcherWithVFs(t, pods, "net1")
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods, Recheck: time.Hour}
	var got []string
	err := a.WaitRemoved(t.Context(), attach.Removal{PodUID: podUID, Domain: testDomain,
		Aliases: []string{attach.Alias("net2")},
		Gone:    func(_ context.Context, alias string) error { got = append(got, alias); return nil }})
	if err != nil || len(got) != 1 || got[0] != attach.Alias("net2") {
		t.Fatalf("got %v, %v; want [%s]", got, err, attach.Alias("net2"))
	}
}

// BenchmarkDetachToGone measures from the fake launcher's detach (the
// moment libvirt sends VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED) to the watch's
// callback: event delivery plus one live-XML reread, over the real socket.
func BenchmarkDetachToGone(b *testing.B) {
	pods := filepath.Join(b.TempDir(), "pods")
	srv := launcherWithVFs(b, pods)
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods, Recheck: time.Hour}
	x, err := attach.Hostdev{Interface: "net1", Source: pciaddr.Address{Bus: 0x3b, Slot: 2, Function: 1}}.XML()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		if err := srv.Plug(testDomain, x); err != nil {
			b.Fatal(err)
		}
		gone := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.WaitRemoved(context.Background(), attach.Removal{PodUID: podUID, Domain: testDomain,
				Aliases: []string{attach.Alias("net1")},
				Gone:    func(context.Context, string) error { close(gone); return nil }})
		}()
		waitSubscribed(b, srv)
		b.StartTimer()
		if err := srv.Detach(testDomain, attach.Alias("net1")); err != nil {
			b.Fatal(err)
		}
		<-gone
		b.StopTimer()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		for srv.Subscribers() != 0 {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
	}
}
