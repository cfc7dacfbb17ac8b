package ownerdir_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/ownerdir"
)

func TestMakeRemovesOnlyDeadOwners(t *testing.T) {
	t.Parallel()
	prefix := "vfod-" + strconv.Itoa(os.Getpid()) + "-"
	// A process that has exited: its PID is free (reuse within the test is
	// practically impossible).
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	dead, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, "owner.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	unowned, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(unowned) })

	live, err := ownerdir.Make(klog.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(live) })
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("dir of a dead owner survived: %v", err)
		_ = os.RemoveAll(dead)
	}
	if _, err := os.Stat(unowned); err != nil {
		t.Errorf("dir without owner.pid removed: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(live, "owner.pid"))
	if err != nil || string(data) != strconv.Itoa(os.Getpid()) {
		t.Errorf("owner.pid = %q, %v; want this PID", data, err)
	}
	ownerdir.RemoveStale(klog.Background(), prefix)
	if _, err := os.Stat(live); err != nil {
		t.Errorf("dir of a live owner removed: %v", err)
	}
}
