package node

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/test/lib/ownerdir"
)

// HostState is what the tier must leave as it found it on the host: the
// host's mounts, cgroup directories and network interfaces.
type HostState struct {
	Mounts     []string
	CgroupDirs []string
	Links      []string
}

const cgroupRoot = "/sys/fs/cgroup"

// Snapshot reads the host state of the calling process's namespaces (the
// parent test runs in the host's).
func Snapshot() (HostState, error) {
	var s HostState
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mount ID and parent ID change nothing; the point and source do.
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			s.Mounts = append(s.Mounts, fields[4]+" "+fields[3])
		}
	}
	f.Close()
	if err := sc.Err(); err != nil {
		return s, err
	}
	// Every directory of every hierarchy (runc makes /k8s.io/<id> ones, the
	// kubelet could make /kubepods ones); a run adds a few hundred at most.
	err = filepath.WalkDir(cgroupRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// A cgroup removed while walking.
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			s.CgroupDirs = append(s.CgroupDirs, p)
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	links, err := netlink.LinkList()
	if err != nil {
		return s, err
	}
	for _, l := range links {
		s.Links = append(s.Links, l.Attrs().Name)
	}
	slices.Sort(s.Mounts)
	slices.Sort(s.Links)
	return s, nil
}

// Diff lists what after has that s has not (new mounts, cgroup
// directories, links) and the node could have made. Other tests run at the
// same time (make test runs the tiers side by side), so what they make is
// told apart: only mounts where the node mounts (/run, /var/lib, /var/log,
// /proc/sys, the scratch directory), runc's and the kubelet's cgroups, and
// the node's bridges and pods' veths count. Another real-node run could
// make the same cgroups; it waits for HostLockFile instead.
func (s HostState) Diff(after HostState) []string {
	var out []string
	added := func(kind string, before, now []string, relevant func(string) bool) {
		have := map[string]bool{}
		for _, b := range before {
			have[b] = true
		}
		for _, a := range now {
			if !have[a] && relevant(a) {
				out = append(out, kind+" "+a)
			}
		}
	}
	added("mount", s.Mounts, after.Mounts, isNodeMount)
	added("cgroup", s.CgroupDirs, after.CgroupDirs, IsNodeCgroup)
	added("link", s.Links, after.Links, isNodeLink)
	return out
}

// isNodeMount: a mount entry ("<mount point> <root>") where the node mounts.
func isNodeMount(m string) bool {
	point, root, _ := strings.Cut(m, " ")
	for _, p := range []string{"/run", "/var/lib", "/var/log", "/proc/sys"} {
		if point == p || strings.HasPrefix(point, p+"/") {
			return true
		}
	}
	return strings.Contains(point, scratchPrefix) || strings.Contains(root, scratchPrefix)
}

// isNodeLink: the node's bridges, or a pod's veth.
func isNodeLink(name string) bool {
	return name == nodeBridge || name == podBridge || strings.HasPrefix(name, "veth")
}

// IsNodeCgroup reports whether a cgroup directory is one the node's
// runtime or kubelet makes (runc: /k8s.io/<id> under containerd's CRI
// namespace; the kubelet: kubepods*).
func IsNodeCgroup(p string) bool {
	return strings.Contains(p, "/k8s.io") || strings.Contains(p, "/kubepods")
}

// RemoveCgroups removes node cgroup directories that after has and s has
// not, deepest first (a cgroup directory goes with rmdir once empty).
func (s HostState) RemoveCgroups(after HostState) error {
	have := map[string]bool{}
	for _, b := range s.CgroupDirs {
		have[b] = true
	}
	var gone []string
	for _, d := range after.CgroupDirs {
		if !have[d] && IsNodeCgroup(d) {
			gone = append(gone, d)
		}
	}
	slices.SortFunc(gone, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var failed []string
	for _, d := range gone {
		if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
			failed = append(failed, fmt.Sprintf("%s: %v", d, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("cannot remove cgroups: %s", strings.Join(failed, "; "))
	}
	return nil
}

// MountNS is the mount namespace of pid, as /proc shows it
// ("mnt:[4026532...]").
func MountNS(pid int) (string, error) {
	return os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
}

// procInfo is one process: its parent and mount namespace.
type procInfo struct {
	ppid int
	mnt  string
}

func processes() map[int]procInfo {
	out := map[int]procInfo{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parens.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		mnt, _ := MountNS(pid)
		out[pid] = procInfo{ppid: ppid, mnt: mnt}
	}
	return out
}

// Leftovers lists the processes that belong to the node: those in its
// mount namespace mnt, those below root (the parent test, a child
// subreaper that inherits the shims; 0 for none), and all their
// descendants (containers run in namespaces of their own but descend from
// a shim). root's own ancestors and root itself are not listed.
func Leftovers(mnt string, root int) []int {
	ps := processes()
	mine := map[int]bool{}
	var is func(pid int, depth int) bool
	is = func(pid, depth int) bool {
		if depth > 64 || pid <= 1 {
			return false
		}
		if v, ok := mine[pid]; ok {
			return v
		}
		p, ok := ps[pid]
		if !ok {
			return false
		}
		v := (mnt != "" && p.mnt == mnt) || (root > 0 && p.ppid == root) || is(p.ppid, depth+1)
		mine[pid] = v
		return v
	}
	var out []int
	for pid := range ps {
		if pid != root && pid != os.Getpid() && is(pid, 0) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// Sweep kills the node's leftover processes (see Leftovers) and reaps the
// ones that became this process's children, until none is left or timeout.
// It returns them as "pid (command)".
func Sweep(mnt string, root int, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	var killed []string
	seen := map[int]bool{}
	for {
		left := Leftovers(mnt, root)
		if len(left) == 0 {
			return killed, nil
		}
		for _, pid := range left {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if syscall.Kill(pid, syscall.SIGKILL) == nil && !seen[pid] {
				seen[pid] = true
				killed = append(killed, fmt.Sprintf("%d (%s)", pid, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
			}
		}
		// Reap orphans reparented to this (subreaper) process.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("processes still running after SIGKILL: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mntnsFile in a scratch directory records the node's mount namespace, so
// a later run can find what a killed run left (SweepStale).
const mntnsFile = "mntns"

// SweepStale kills what earlier runs left whose test process was killed
// (SIGKILL on a timeout: no teardown ran): the processes of their node's
// mount namespace and their descendants. A namespace's inode number can be
// reused once it is gone, so a process counts only if its mounts include
// that run's scratch directory. Their directories go with ownerdir.
func SweepStale(prefix string) []string {
	var killed []string
	for _, dir := range ownerdir.Stale(prefix) {
		b, err := os.ReadFile(filepath.Join(dir, mntnsFile))
		if err != nil {
			continue
		}
		mnt := strings.TrimSpace(string(b))
		ps := processes()
		var inNS []int
		for pid, p := range ps {
			if p.mnt != mnt {
				continue
			}
			mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if err == nil && strings.Contains(string(mi), filepath.Base(dir)) {
				inNS = append(inNS, pid)
			}
		}
		if len(inNS) == 0 {
			continue
		}
		k, _ := Sweep(mnt, 0, 10*time.Second)
		killed = append(killed, k...)
	}
	return killed
}
