package node

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// TreeCPU is the CPU time (user + system) used so far by process root and
// every live descendant, each with what its reaped children used: the
// node's processes (control plane, containerd, kubelet, shims, containers)
// are all below the test process inside the namespace, which reaps the
// shims as a subreaper. The difference of two readings is what ran in
// between, give or take a process that ended unreaped.
func TreeCPU(root int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	parent := map[int]int{}
	ticks := map[int]int64{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command may hold spaces and parentheses: fields start after
		// the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		// f[0] is field 3 (state); ppid is field 4, utime..cstime 14..17.
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		parent[pid] = ppid
		var sum int64
		for _, k := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(string(f[k]), 10, 64)
			sum += v
		}
		ticks[pid] = sum
	}
	var total int64
	for pid, t := range ticks {
		for p, hops := pid, 0; p > 0 && hops < 64; p, hops = parent[p], hops+1 {
			if p == root {
				total += t
				break
			}
		}
	}
	return time.Duration(total) * time.Second / clockTicks
}
