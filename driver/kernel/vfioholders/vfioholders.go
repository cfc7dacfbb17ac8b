// Package vfioholders finds the processes that hold VFIO group nodes
// (/dev/vfio/<group>) open, by walking /proc/<pid>/fd the way fuser and lsof
// do. A VF found bound to vfio-pci is free for vfnet only when nobody holds
// its group node: QEMU, a DPDK application or another device plugin's
// consumer keeps it open for as long as it uses the device.
//
// Files are compared by identity, not by path: a holder in a container sees
// the node under its own /dev (a different inode made by the runtime), so a
// character device matches on its device number (st_rdev), anything else
// (the simulated nodes of test/lib/simhost are regular files) on device and inode.
// The driver runs with hostPID, so ProcRoot /proc shows every process of
// the node; tests point ProcRoot at a synthetic tree.
package vfioholders

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Holder is a process holding a group node open.
type Holder struct {
	PID  int
	Comm string
}

func (h Holder) String() string { return fmt.Sprintf("pid %d (%s)", h.PID, h.Comm) }

// Scanner looks for holders of nodes under DevRoot/vfio in ProcRoot.
type Scanner struct {
	ProcRoot string // "/proc"
	DevRoot  string // "/dev"
}

type fileID struct {
	char     bool
	rdev     uint64
	dev, ino uint64
}

func idOf(st *syscall.Stat_t) fileID {
	if st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
		return fileID{char: true, rdev: st.Rdev}
	}
	return fileID{dev: st.Dev, ino: st.Ino}
}

// Holders returns, per node name ("17", "noiommu-3"), the processes that
// hold DevRoot/vfio/<node> open, sorted by PID. A node that does not exist
// is an error (wrong DevRoot). The error is also set when /proc could not be read completely
// (e.g. no permission to read another process's fd directory): a caller
// must then treat every node as possibly in use.
func (s Scanner) Holders(nodes []string) (map[string][]Holder, error) {
	out := make(map[string][]Holder, len(nodes))
	want := map[fileID]string{}
	for _, n := range nodes {
		if n == "" || strings.ContainsRune(n, '/') {
			return nil, fmt.Errorf("VFIO group node name %q: want a group number or noiommu-<N>", n)
		}
		out[n] = nil
		var st syscall.Stat_t
		p := filepath.Join(s.DevRoot, "vfio", n)
		if err := syscall.Stat(p, &st); err != nil {
			// The kernel creates the node with the group (devtmpfs): a
			// missing one means this is not the host's /dev.
			return nil, fmt.Errorf("stat %s (is the host's /dev mounted there? --dev-root): %w", p, err)
		}
		want[idOf(&st)] = n
	}
	if len(want) == 0 {
		return out, nil
	}
	procs, err := os.ReadDir(s.ProcRoot)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", s.ProcRoot, err)
	}
	var errs []error
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join(s.ProcRoot, p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue // exited meanwhile
			}
			errs = append(errs, err)
			continue
		}
		for _, fd := range fds {
			link := filepath.Join(fdDir, fd.Name())
			target, err := os.Readlink(link)
			// Only paths that can be a group node are stat'ed: a host has
			// many thousands of open files.
			if err != nil || !strings.Contains(target, "vfio") {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(link, &st) != nil {
				continue
			}
			n, ok := want[idOf(&st)]
			if !ok {
				continue
			}
			h := Holder{PID: pid, Comm: comm(filepath.Join(s.ProcRoot, p.Name()))}
			if l := out[n]; len(l) == 0 || l[len(l)-1].PID != pid {
				out[n] = append(l, h)
			}
		}
	}
	for n := range out {
		sort.Slice(out[n], func(i, j int) bool { return out[n][i].PID < out[n][j].PID })
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("cannot read the open files of %d process(es) (first: %w); run with hostPID and CAP_SYS_PTRACE", len(errs), errs[0])
	}
	return out, nil
}

func comm(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "comm"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
