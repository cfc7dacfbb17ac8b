package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSweepStale: what a killed run left (a process in the node's mount
// namespace, its child) is killed by the next run; a process in another
// namespace, or in one whose mounts do not show the run's directory, is not.
func TestSweepStale(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a private mount namespace)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare")
	}
	const prefix = "vfnet-sweeptest-"
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The owner is a process that has exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(dead.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The run's node: a private mount namespace showing dir, with a child.
	node := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount --bind "+dir+" "+dir+" && sleep 600 & wait")
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { node.Wait(); close(done) }()
	defer node.Process.Kill()
	// An unrelated process (the host's namespace) must survive.
	other := exec.Command("sleep", "600")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()

	var mnt string
	deadline := time.Now().Add(10 * time.Second)
	for {
		mnt, _ = MountNS(node.Process.Pid)
		mi, _ := os.ReadFile("/proc/" + strconv.Itoa(node.Process.Pid) + "/mountinfo")
		host, _ := MountNS(os.Getpid())
		if mnt != "" && mnt != host && strings.Contains(string(mi), filepath.Base(dir)) && len(Leftovers(mnt, 0)) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace not set up: mnt %q", mnt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, mntnsFile), []byte(mnt), 0o644); err != nil {
		t.Fatal(err)
	}
	killed := SweepStale(prefix)
	if len(killed) < 2 {
		t.Errorf("killed %v, want the namespace's shell and its sleep", killed)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stale node's process survived")
	}
	if left := Leftovers(mnt, 0); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
	if err := syscall.Kill(other.Process.Pid, 0); err != nil {
		t.Errorf("unrelated process: %v", err)
	}
}

// TestDiffCountsOnlyWhatTheNodeMakes: other tiers of make test run at the
// same time; their mounts, cgroups and links are not the node's leftovers.
func TestDiffCountsOnlyWhatTheNodeMakes(t *testing.T) {
	t.Parallel()
	before := HostState{Mounts: []string{"/ /"}, CgroupDirs: []string{"/sys/fs/cgroup/memory"}, Links: []string{"lo"}}
	after := HostState{
		Mounts: []string{"/ /", "/tmp/other-test /", "/run/netns/cni-1 nsfs", "/tmp/x /tmp/vfnet-node-123/run"},
		CgroupDirs: []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/other.slice",
			"/sys/fs/cgroup/memory/k8s.io", "/sys/fs/cgroup/memory/k8s.io/abc"},
		Links: []string{"lo", "dummy-other", "cni0", "veth1234"},
	}
	got := before.Diff(after)
	want := []string{"mount /run/netns/cni-1 nsfs", "mount /tmp/x /tmp/vfnet-node-123/run",
		"cgroup /sys/fs/cgroup/memory/k8s.io", "cgroup /sys/fs/cgroup/memory/k8s.io/abc", "link cni0", "link veth1234"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("diff\n got %q\nwant %q", got, want)
	}
}
