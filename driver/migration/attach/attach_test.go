package attach_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
)

const testDomain = "default_vm1"

// A trimmed launcher domain: 2 GiB guest, one virtio disk, no hostdevs (the
// source launcher detached them before migrating).
const domainXML = `<domain type='kvm'>
  <name>default_vm1</name>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>2097152</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='/var/run/kubevirt-private/vmi-disks/disk0/disk.img'/>
      <target dev='vda' bus='virtio'/>
      <alias name='ua-disk0'/>
    </disk>
  </devices>
</domain>`

type memlockCall struct {
	runtimeDir, domain string
	bytes              uint64
}

type fakeMemlock struct {
	mu    sync.Mutex
	calls []memlockCall
	err   error
}

func (f *fakeMemlock) EnsureMemlock(_ context.Context, runtimeDir, domain string, b uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, memlockCall{runtimeDir, domain, b})
	return f.err
}

func (f *fakeMemlock) Calls() []memlockCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]memlockCall(nil), f.calls...)
}

// podsDir returns a kubelet-like pods dir whose socket paths are longer than
// a unix socket path may be, as on a real node.
func podsDir(t *testing.T) string {
	d := filepath.Join(t.TempDir(), "var", "lib", "kubelet", "pods")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

const podUID = "6f1c2a0e-9d3b-4c55-8f0e-1a2b3c4d5e6f"

func startLauncher(t *testing.T, pods string) *libvirtfake.Server {
	t.Helper()
	rd := attach.RuntimeDir(pods, podUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := libvirtfake.Listen(rd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunning(domainXML); err != nil {
		t.Fatal(err)
	}
	return srv
}

func mustPCI(t *testing.T, s string) pciaddr.Address {
	t.Helper()
	a, err := pciaddr.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func validate(t *testing.T, domXML string) {
	t.Helper()
	err := libvirtfake.ValidateDomain(domXML)
	if errors.Is(err, libvirtfake.ErrNoValidator) {
		t.Fatalf("%v: install it (make deps, or apt-get install libvirt-clients)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestAttachHotplugsWithGuestAddressAndBootOrder(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	if n := len(filepath.Join(attach.RuntimeDir(pods, podUID), attach.SocketName)); n < 108 {
		t.Fatalf("test socket path is %d bytes; it must exceed the unix limit to test the O_PATH dial", n)
	}
	srv := startLauncher(t, pods)
	ml := &fakeMemlock{}
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: ml, PodsDir: pods}
	guest := mustPCI(t, "0000:81:01.0")
	boot := uint(2)
	req := attach.Request{PodUID: podUID, Domain: testDomain, Hostdevs: []attach.Hostdev{
		{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1"), Guest: &guest, BootOrder: &boot},
		{Interface: "second", Source: mustPCI(t, "0000:3b:02.2")},
	}}
	res, err := a.Attach(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.Attached, ","); got != "ua-sriov-dra-net,ua-sriov-second" {
		t.Fatalf("attached %q", got)
	}
	if uris := srv.ConnectURIs(); len(uris) != 1 || uris[0] != "qemu:///session" {
		t.Fatalf("connect URIs %v, want one qemu:///session", uris)
	}
	calls := ml.Calls()
	wantBytes := uint64(2<<30) + attach.VFIOMemlockOverhead
	if len(calls) != 1 || calls[0].bytes != wantBytes || calls[0].domain != testDomain || calls[0].runtimeDir != attach.RuntimeDir(pods, podUID) {
		t.Fatalf("memlock calls %+v, want one for %d bytes", calls, wantBytes)
	}
	got := srv.Attaches()
	if len(got) != 2 {
		t.Fatalf("fake received %d attaches, want 2", len(got))
	}
	for _, at := range got {
		if at.Flags != uint32(libvirt.DomainAffectLive) || at.Domain != testDomain {
			t.Errorf("attach to %q with flags %d, want %q live", at.Domain, at.Flags, testDomain)
		}
		validate(t, libvirtfake.WrapHostdev("v", at.XML))
	}
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(got[0].XML); err != nil {
		t.Fatal(err)
	}
	src := hd.SubsysPCI.Source.Address
	if hd.Managed != "no" || hd.Alias.Name != "ua-sriov-dra-net" || *src.Bus != 0x3b || *src.Slot != 2 || *src.Function != 1 {
		t.Errorf("first hostdev: %s", got[0].XML)
	}
	if hd.Address == nil || hd.Address.PCI == nil || *hd.Address.PCI.Bus != 0x81 || *hd.Address.PCI.Slot != 1 {
		t.Errorf("guest address missing or wrong: %s", got[0].XML)
	}
	if hd.Boot == nil || hd.Boot.Order != 2 {
		t.Errorf("boot order missing: %s", got[0].XML)
	}
	if strings.Contains(got[1].XML, "<boot") || strings.Contains(got[1].XML, "<address type") {
		t.Errorf("second hostdev has guest address or boot order it did not ask for: %s", got[1].XML)
	}
	live, err := srv.DomainXML(testDomain)
	if err != nil {
		t.Fatal(err)
	}
	validate(t, live)
}

func TestAttachIsIdempotent(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	ml := &fakeMemlock{}
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: ml, PodsDir: pods}
	req := attach.Request{PodUID: podUID, Domain: testDomain, Hostdevs: []attach.Hostdev{
		{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")},
	}}
	if _, err := a.Attach(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	res, err := a.Attach(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Attached) != 0 || len(res.Present) != 1 || res.Present[0] != "ua-sriov-dra-net" {
		t.Fatalf("second attach: %+v, want alias reported present and nothing attached", res)
	}
	if n := len(srv.Attaches()); n != 1 {
		t.Fatalf("fake received %d attaches, want 1", n)
	}
	if n := len(ml.Calls()); n != 1 {
		t.Fatalf("memlock raised %d times, want 1 (only before an actual attach)", n)
	}
}

func TestAttachRefusesVFHeldUnderOtherAlias(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{}, PodsDir: pods}
	vf := mustPCI(t, "0000:3b:02.1")
	if _, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "a", Source: vf}}}); err != nil {
		t.Fatal(err)
	}
	_, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "b", Source: vf}}})
	var gu *attach.GaveUpError
	if !errors.As(err, &gu) || !gu.Permanent || gu.Attempts != 1 {
		t.Fatalf("err = %v, want a permanent give-up on the first attempt", err)
	}
	if n := len(srv.Attaches()); n != 1 {
		t.Fatalf("fake received %d attaches, want 1", n)
	}
}

// hookDialer runs a hook before each dial, to bring the launcher up late.
type hookDialer struct {
	mu     sync.Mutex
	n      int
	before func(n int)
}

func (d *hookDialer) Dial(ctx context.Context, runtimeDir string) (attach.Session, error) {
	d.mu.Lock()
	d.n++
	d.before(d.n)
	d.mu.Unlock()
	return attach.SessionDialer{}.Dial(ctx, runtimeDir)
}

func TestAttachRetriesUntilSocketAndDomainAppear(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	rd := attach.RuntimeDir(pods, podUID)
	var srv *libvirtfake.Server
	d := &hookDialer{before: func(n int) {
		switch n {
		case 3: // the emptyDir exists, the daemon is not listening yet
			if err := os.MkdirAll(rd, 0o755); err != nil {
				t.Error(err)
			}
		case 5: // the daemon listens, the incoming domain is not there yet
			var err error
			if srv, err = libvirtfake.Listen(rd); err != nil {
				t.Error(err)
			}
		case 7:
			if err := srv.DefineRunning(domainXML); err != nil {
				t.Error(err)
			}
		}
	}}
	t.Cleanup(func() {
		if srv != nil {
			_ = srv.Close()
		}
	})
	a := &attach.Attacher{Dialer: d, Memlock: &fakeMemlock{}, PodsDir: pods,
		InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Timeout: time.Minute}
	res, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 7 || len(res.Attached) != 1 {
		t.Fatalf("result %+v, want the 7th attempt to attach", res)
	}
}

func TestAttachGivesUpAfterTimeout(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{}, PodsDir: pods,
		InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Timeout: 100 * time.Millisecond}
	_, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	var gu *attach.GaveUpError
	if !errors.As(err, &gu) || gu.Permanent || gu.Attempts < 2 {
		t.Fatalf("err = %v, want a non-permanent give-up after retries", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want it to wrap the missing runtime dir", err)
	}
}

func TestAttachStopsOnPermanentLibvirtError(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	srv.FailAttaches(&libvirt.Error{Code: uint32(libvirt.ErrConfigUnsupported),
		Message: "unsupported configuration: host doesn't support passthrough of host PCI devices"})
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{}, PodsDir: pods, Timeout: time.Minute}
	_, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	var gu *attach.GaveUpError
	if !errors.As(err, &gu) || !gu.Permanent || gu.Attempts != 1 || !strings.Contains(err.Error(), "passthrough") {
		t.Fatalf("err = %v, want a permanent give-up with libvirt's message", err)
	}
}

// A VF beyond PCI domain ffff (Intel VMD) is refused before the launcher
// is reached: QEMU's vfio-pci would refuse the hot-plug (pciaddr's domain
// rule), and no retry can change that.
func TestAttachRefusesVMDDomainVF(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{}, PodsDir: pods, Timeout: time.Minute}
	vmd := pciaddr.Address{Domain: 0x10000, Bus: 0x3b, Slot: 2, Function: 1}
	_, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: vmd}}})
	var gu *attach.GaveUpError
	if !errors.As(err, &gu) || !gu.Permanent || gu.Attempts != 1 || !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), "10000:3b:02.1") {
		t.Fatalf("err = %v, want a permanent give-up with pciaddr.ErrDomain naming the VF", err)
	}
	if n := len(srv.Attaches()); n != 0 {
		t.Fatalf("fake received %d attaches, want none", n)
	}
}

func TestAttachFailsWhenMemlockCannotBeRaised(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	// The deadline leaves room for several complete attempts on a loaded
	// machine; the one it cuts short must not hide their cause.
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{err: errors.New("operation not permitted")},
		PodsDir: pods, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Timeout: 500 * time.Millisecond}
	_, err := a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	if err == nil || !strings.Contains(err.Error(), "operation not permitted") {
		t.Fatalf("err = %v, want the memlock failure", err)
	}
	if n := len(srv.Attaches()); n != 0 {
		t.Fatalf("fake received %d attaches; no VF may be attached before memlock is raised", n)
	}
}

func TestSessionDialerRefusedBySystemURIModel(t *testing.T) {
	t.Parallel()
	// The fake refuses anything but qemu:///session, as the real session
	// daemon does; the dialer must use the session URI to get through.
	pods := podsDir(t)
	srv := startLauncher(t, pods)
	s, err := attach.SessionDialer{}.Dial(context.Background(), attach.RuntimeDir(pods, podUID))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.DomainXML("default_missing"); !libvirt.IsNotFound(err) {
		t.Fatalf("lookup of a missing domain: %v, want libvirt's no-domain error", err)
	}
	if uris := srv.ConnectURIs(); len(uris) != 1 || uris[0] != string(libvirt.QEMUSession) {
		t.Fatalf("URIs %v", uris)
	}
}

// BenchmarkAttach measures one AttachOnce against the fake over the real
// socket: O_PATH dial, qemu:///session open, lookup, live XML, hot-plug.
func BenchmarkAttach(b *testing.B) {
	pods := filepath.Join(b.TempDir(), "pods")
	rd := attach.RuntimeDir(pods, podUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		b.Fatal(err)
	}
	srv, err := libvirtfake.Listen(rd)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods}
	src, _ := pciaddr.Parse("0000:3b:02.1")
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		name := "default_vm" + strconv.Itoa(i)
		if err := srv.DefineRunning(strings.Replace(domainXML, "default_vm1", name, 1)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := a.AttachOnce(context.Background(), attach.Request{PodUID: podUID, Domain: name,
			Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: src}}})
		if err != nil || len(res.Attached) != 1 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// TestAttachBoundedWhenDaemonHangs: a daemon that accepts and never answers
// (a wedged virtqemud) must not hang the attach past its timeout.
func TestAttachBoundedWhenDaemonHangs(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	rd := attach.RuntimeDir(pods, podUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(rd, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(fd) }()
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, attach.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: &fakeMemlock{}, PodsDir: pods,
		InitialBackoff: 10 * time.Millisecond, Timeout: 300 * time.Millisecond}
	_, err = a.Attach(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	var gu *attach.GaveUpError
	if !errors.As(err, &gu) || gu.Permanent {
		t.Fatalf("err = %v, want a give-up after the timeout", err)
	}
}
