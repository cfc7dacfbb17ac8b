package kernel

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// CaseCPU records the CPU time QEMU (all its threads: the guest's vCPUs and
// everything the guest runs, nested QEMU included) used during each case,
// read from /proc/<pid>/stat when the case's BEGIN and result marks pass on
// the console. It shows which case costs the machine, which wall time on a
// shared machine does not.
type CaseCPU struct {
	mu    sync.Mutex
	pid   int
	tail  []byte
	begin map[string]time.Duration
	used  map[string]time.Duration
	// windows are the measured windows (layout.MarkWindow lines), by name.
	winBegin map[string]time.Duration
	windows  map[string]time.Duration
}

// NewCaseCPU returns an empty meter; Run starts it.
func NewCaseCPU() *CaseCPU {
	return &CaseCPU{begin: map[string]time.Duration{}, used: map[string]time.Duration{},
		winBegin: map[string]time.Duration{}, windows: map[string]time.Duration{}}
}

func (m *CaseCPU) start(pid int) {
	m.mu.Lock()
	m.pid = pid
	m.mu.Unlock()
}

// Used is the CPU time QEMU used during case name; false when the case did
// not both begin and end.
func (m *CaseCPU) Used(name string) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.used[name]
	return d, ok
}

// Windows are the CPU times QEMU used in each window a case opened and
// closed with layout.MarkWindow lines.
func (m *CaseCPU) Windows() map[string]time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.windows)
}

// Write takes the console stream; only whole lines are looked at.
func (m *CaseCPU) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tail = append(m.tail, p...)
	for {
		i := bytes.IndexByte(m.tail, '\n')
		if i < 0 {
			break
		}
		m.line(string(m.tail[:i]))
		m.tail = m.tail[i+1:]
	}
	if len(m.tail) > 4096 { // a line without end is no mark of ours
		m.tail = m.tail[:0]
	}
	return len(p), nil
}

func (m *CaseCPU) line(l string) {
	if m.pid == 0 {
		return
	}
	if i := strings.Index(l, layout.MarkWindow+" "); i >= 0 {
		m.window(strings.Fields(l[i+len(layout.MarkWindow):]))
		return
	}
	i := strings.Index(l, MarkCase+" ")
	if i < 0 {
		return
	}
	m.stamp(strings.Fields(l[i+len(MarkCase):]), m.begin, m.used, "PASS", "FAIL", "SKIP")
}

// window takes the fields after layout.MarkWindow: a name, BEGIN or END.
func (m *CaseCPU) window(f []string) { m.stamp(f, m.winBegin, m.windows, "END") }

// stamp takes a mark's fields (a name, then BEGIN or one of ends): QEMU's
// CPU time at BEGIN goes into begin, the time used since into used.
func (m *CaseCPU) stamp(f []string, begin, used map[string]time.Duration, ends ...string) {
	if len(f) < 2 {
		return
	}
	now, err := processCPU(m.pid)
	if err != nil {
		return
	}
	switch {
	case f[1] == "BEGIN":
		begin[f[0]] = now
	case slices.Contains(ends, f[1]):
		if b, ok := begin[f[0]]; ok {
			used[f[0]] = now - b
		}
	}
}

// processCPU is a process's user + system CPU time (its threads included).
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it do not.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	// f[11] and f[12] are utime and stime (fields 14 and 15), in clock
	// ticks; Linux reports them in USER_HZ, 100 on every architecture Go
	// supports here.
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100), nil
}
