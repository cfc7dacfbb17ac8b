//go:build kernelguest

package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// execInPodArg makes this binary a container runtime for one container of
// the vm case's launcher pod: it takes a containerSpec (JSON) after it,
// makes a mount namespace with the pod's volumes and the CDI mounts bound
// at their container paths, drops to the container's user and execs the
// container's program.
const execInPodArg = "-vfnet-exec-in-pod"

// bind is one mount of a container: a pod volume or a CDI mount.
type bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// containerSpec is what execInPod needs.
type containerSpec struct {
	Binds []bind   `json:"binds"`
	UID   int      `json:"uid"`
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	// Reaper runs the program under a process that reaps every orphan
	// below it, as virt-launcher-monitor does for the compute container:
	// libvirt daemonizes QEMU, and a QEMU nobody waits for stays a zombie,
	// which libvirt takes for a process that would not die.
	Reaper bool `json:"reaper"`
}

func execInPod(specJSON string) {
	var s containerSpec
	err := json.Unmarshal([]byte(specJSON), &s)
	if err == nil {
		err = enterPod(s)
	}
	fmt.Fprintf(os.Stderr, "run container %v: %v\n", s.Argv, err)
	os.Exit(1)
}

func enterPod(s containerSpec) error {
	// The namespace is the calling thread's; execve keeps it.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	for _, b := range s.Binds {
		st, err := os.Stat(b.Source)
		if err != nil {
			return err
		}
		// The mount point is created on the guest's root file system, which
		// every mount namespace shares: an empty directory or file.
		if st.IsDir() {
			err = os.MkdirAll(b.Target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(b.Target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(b.Target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("mount point %s: %w", b.Target, err)
		}
		if err := unix.Mount(b.Source, b.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", b.Source, b.Target, err)
		}
	}
	if s.UID != 0 {
		// The launcher pod's containers run as 107:107 (non-root VMs).
		if err := syscall.Setgroups([]int{s.UID}); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setresgid(s.UID, s.UID, s.UID); err != nil {
			return fmt.Errorf("setresgid %d: %w", s.UID, err)
		}
		if err := syscall.Setresuid(s.UID, s.UID, s.UID); err != nil {
			return fmt.Errorf("setresuid %d: %w", s.UID, err)
		}
	}
	env := append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...)
	if s.Reaper {
		return reap(s.Argv, env)
	}
	if err := unix.Exec(s.Argv[0], s.Argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", strings.Join(s.Argv, " "), err)
	}
	return nil
}

// reap starts argv as a child, becomes the subreaper of everything below
// it, waits for all of them and exits with the child's status. SIGTERM is
// passed on to the child.
func reap(argv, env []string) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a subreaper: %w", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}})
	if err != nil {
		return fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	go func() {
		for sig := range sigs {
			_ = syscall.Kill(pid, sig.(syscall.Signal))
		}
	}()
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait: %w", err)
		}
		if got == pid {
			// As the kernel ends a container's PID namespace with its init:
			// what the program left running (virtlogd) is killed and reaped.
			killChildren()
			if ws.Signaled() {
				os.Exit(128 + int(ws.Signal()))
			}
			os.Exit(ws.ExitStatus())
		}
	}
}

// killChildren SIGKILLs this process's children (orphans reparented to it
// included) until none is left.
func killChildren() {
	for {
		var kids []int
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
		for _, f := range tasks {
			data, _ := os.ReadFile(f)
			for _, w := range strings.Fields(string(data)) {
				if k, err := strconv.Atoi(w); err == nil {
					kids = append(kids, k)
				}
			}
		}
		for _, k := range kids {
			_ = syscall.Kill(k, syscall.SIGKILL)
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
			return
		}
	}
}
