package vflink

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inFreshNetns runs fn on an OS thread of its own moved into a new network
// namespace. The thread is never unlocked, so it exits with the goroutine
// and the namespace goes with its last reference: nothing is left on the
// machine. fn gets the path of the namespace file; keep it alive until
// release is closed.
func inFreshNetns(fn func(nsPath string) error, release <-chan struct{}) <-chan error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare -n: %w", err)
			return
		}
		errc <- fn(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if release != nil {
			<-release
		}
	}()
	return errc
}

func needNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating network namespaces needs root")
	}
}

// TestHostNetnsFromOtherNamespace is issue 10's blocker on this machine's
// kernel: namespace A stands for the host (a bridge there stands for the
// PF), namespace B for the driver pod's own. The link layer runs in B and
// is opened on A's namespace file, as the driver opens /proc/1/ns/net: it
// resolves and reads the link that exists only in A. What the driver did
// before (netlink.LinkByName in its own namespace) does not find it.
func TestHostNetnsFromOtherNamespace(t *testing.T) {
	needNetns(t)
	const pf = "vfnettest0"
	release := make(chan struct{})
	defer close(release)
	var hostNs string
	var wantIndex int
	if err := <-inFreshNetns(func(nsPath string) error {
		hostNs = nsPath
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: pf}}); err != nil {
			return fmt.Errorf("add bridge %s: %w", pf, err)
		}
		l, err := netlink.LinkByName(pf)
		if err != nil {
			return err
		}
		wantIndex = l.Attrs().Index
		return nil
	}, release); err != nil {
		t.Fatal(err)
	}

	if err := <-inFreshNetns(func(podNs string) error {
		if _, err := netlink.LinkByName(pf); err == nil {
			return fmt.Errorf("%s is visible in the pod's own namespace: the test proves nothing", pf)
		}
		links, err := Open(hostNs)
		if err != nil {
			return err
		}
		defer links.Close()
		d, err := links.Resolve(pf)
		if err != nil {
			return fmt.Errorf("resolve %s through %s from %s: %w", pf, hostNs, podNs, err)
		}
		if d.Name != pf || d.Index != wantIndex {
			return fmt.Errorf("resolved %+v, want %s index %d", d, pf, wantIndex)
		}
		// A VF read reaches the link (a bridge has no VFs), not ENODEV.
		_, err = links.VF(pf, 0)
		if err == nil || IsLinkNotFound(err) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "reports no VF 0") {
			return fmt.Errorf("VF read of %s: %v", pf, err)
		}
		// A set reaches the kernel too: the bridge has no VF settings.
		if err := links.SetTrust(pf, 0, true); err == nil || IsLinkNotFound(err) {
			return fmt.Errorf("SetTrust on %s: %v", pf, err)
		}
		// And a link only the pod's namespace has is not found there.
		_, err = links.Resolve("vfnet-absent0")
		if !IsLinkNotFound(err) || !strings.Contains(err.Error(), hostNs) {
			return fmt.Errorf("resolve of a missing link: %v", err)
		}
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}

	// The same from a whole process started in a fresh namespace (as the
	// driver's pod is), this test binary re-run as a child.
	cmd := exec.Command(os.Args[0], "-test.run=^TestLinkLayerChildProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "VFNET_TEST_NETNS="+hostNs, "VFNET_TEST_LINK="+pf, "VFNET_TEST_INDEX="+strconv.Itoa(wantIndex))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestLinkLayerChildProcess") {
		t.Fatalf("child process in a fresh namespace: %v\n%s", err, out)
	}
}

// TestLinkLayerChildProcess is the child of TestHostNetnsFromOtherNamespace:
// a process in its own network namespace opening the link layer on
// another one's file.
func TestLinkLayerChildProcess(t *testing.T) {
	ns, pf := os.Getenv("VFNET_TEST_NETNS"), os.Getenv("VFNET_TEST_LINK")
	if ns == "" {
		t.Skip("run by TestHostNetnsFromOtherNamespace")
	}
	if _, err := netlink.LinkByName(pf); err == nil {
		t.Fatalf("%s is visible in the child's own namespace", pf)
	}
	links, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer links.Close()
	d, err := links.Resolve(pf)
	if err != nil || strconv.Itoa(d.Index) != os.Getenv("VFNET_TEST_INDEX") {
		t.Fatalf("resolve %s in %s: %+v %v", pf, ns, d, err)
	}
	if _, err := links.VF(pf, 0); IsLinkNotFound(err) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("VF read: %v", err)
	}
}

// A missing namespace file (a pod without hostPID has its own /proc/1)
// names the path and the fix; a file that is not a namespace says so.
func TestOpenMissingNamespace(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "1", "ns", "net")
	_, err := Open(missing)
	var nse *NamespaceError
	if !errors.As(err, &nse) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) ||
		!strings.Contains(err.Error(), "hostPID: true") || !strings.Contains(err.Error(), "--host-netns") {
		t.Fatalf("Open(%s): %v", missing, err)
	}
	if os.Geteuid() != 0 {
		return
	}
	plain := filepath.Join(t.TempDir(), "net")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(plain)
	if !errors.As(err, &nse) || !strings.Contains(err.Error(), "not a network namespace file") {
		t.Fatalf("Open(regular file): %v", err)
	}
}
