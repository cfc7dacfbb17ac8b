package controlplane

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

const helperEnv = "VFNET_CONTROLPLANE_INTERRUPT_HELPER"

// TestInterruptChildProcess is the child of TestInterruptCleansUp: it starts a
// plane, prints its directory and component PIDs, and waits for SIGINT.
func TestInterruptChildProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper process of TestInterruptCleansUp")
	}
	_, ctx := ktesting.NewTestContext(t)
	p, err := Start(ctx, Options{HandleSignals: true})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(3)
	}
	var pids []string
	for _, pr := range p.procs {
		pids = append(pids, strconv.Itoa(pr.cmd.Process.Pid))
	}
	fmt.Printf("READY %s %s\n", p.Dir, strings.Join(pids, ","))
	time.Sleep(2 * time.Minute) // the signal handler ends the process
	os.Exit(4)
}

// TestInterruptCleansUp interrupts a process that runs a plane (as ^C does a
// `make demo` or a test run) and checks that no component process and no
// directory is left behind.
func TestInterruptCleansUp(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var dir string
	var pids []int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "READY" {
			dir = f[1]
			for _, s := range strings.Split(f[2], ",") {
				pid, _ := strconv.Atoi(s)
				pids = append(pids, pid)
			}
			break
		}
		if len(f) > 0 && f[0] == "ERROR" {
			t.Fatalf("helper: %s", sc.Text())
		}
	}
	if dir == "" || len(pids) != 4 {
		t.Fatalf("helper did not report a ready plane (dir %q, pids %v)", dir, pids)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = bufio.NewReader(stdout).WriteTo(os.Stderr) }()
	err = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("helper ended with %v, want death by the re-raised SIGINT", err)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("component pid %d survived the interrupt", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("plane dir %s survived the interrupt (stat err %v)", dir, err)
	}
}
