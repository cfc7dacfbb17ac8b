package kernel

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// qmpHuman runs one human-monitor command over QEMU's QMP socket and
// returns its text. It is how a stalled guest is examined: the serial
// console says nothing about a kernel that hangs before it prints.
func qmpHuman(sock, command string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		return "", fmt.Errorf("connect to QEMU's QMP socket %s: %w", sock, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	// read skips QMP events; it returns the next reply.
	read := func() (map[string]json.RawMessage, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, err
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				return nil, fmt.Errorf("QMP sent %q: %w", line, err)
			}
			if _, ev := m["event"]; !ev {
				return m, nil
			}
		}
	}
	if _, err := read(); err != nil { // the greeting
		return "", fmt.Errorf("QMP greeting: %w", err)
	}
	for _, cmd := range []any{
		map[string]any{"execute": "qmp_capabilities"},
		map[string]any{"execute": "human-monitor-command", "arguments": map[string]string{"command-line": command}},
	} {
		if err := enc.Encode(cmd); err != nil {
			return "", err
		}
		m, err := read()
		if err != nil {
			return "", fmt.Errorf("QMP %v: %w", cmd, err)
		}
		if e, ok := m["error"]; ok {
			return "", fmt.Errorf("QMP %v: %s", cmd, e)
		}
		if ret, ok := m["return"]; ok && string(ret) != "{}" {
			var s string
			if err := json.Unmarshal(ret, &s); err != nil {
				return "", fmt.Errorf("QMP %v returned %s: %w", cmd, ret, err)
			}
			return s, nil
		}
	}
	return "", nil
}

// symbols is a kernel's System.map (text symbols only), sorted by address.
type symbols struct {
	addr []uint64
	name []string
}

func loadSymbols(path string) (*symbols, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := &symbols{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) != 3 || (fl[1] != "t" && fl[1] != "T") {
			continue
		}
		a, err := strconv.ParseUint(fl[0], 16, 64)
		if err != nil {
			continue
		}
		s.addr = append(s.addr, a)
		s.name = append(s.name, fl[2])
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	idx := make([]int, len(s.addr))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return s.addr[idx[i]] < s.addr[idx[j]] })
	sorted := &symbols{addr: make([]uint64, len(idx)), name: make([]string, len(idx))}
	for i, k := range idx {
		sorted.addr[i], sorted.name[i] = s.addr[k], s.name[k]
	}
	return sorted, nil
}

// lookup names the function holding addr ("func+0x1a"), or "" outside
// the kernel's text (a module, user space).
func (s *symbols) lookup(addr uint64) string {
	if s == nil || len(s.addr) == 0 || addr < s.addr[0] {
		return ""
	}
	i := sort.Search(len(s.addr), func(i int) bool { return s.addr[i] > addr }) - 1
	if off := addr - s.addr[i]; off < 1<<20 {
		return fmt.Sprintf("%s+0x%x", s.name[i], off)
	}
	return ""
}

var ripRE = regexp.MustCompile(`RIP=([0-9a-f]{16})`)

// cpuSamples asks QEMU n times for every vCPU's registers and says where
// each vCPU was, by kernel symbol: enough to tell a guest spinning in one
// place from one that idles or still works.
func cpuSamples(sock string, syms *symbols, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			time.Sleep(time.Second)
		}
		out, err := qmpHuman(sock, "info registers -a", 10*time.Second)
		if err != nil {
			fmt.Fprintf(&b, "sample %d: %v\n", i+1, err)
			continue
		}
		var where []string
		for _, m := range ripRE.FindAllStringSubmatch(out, -1) {
			a, _ := strconv.ParseUint(m[1], 16, 64)
			w := m[1]
			if s := syms.lookup(a); s != "" {
				w += " " + s
			}
			where = append(where, w)
		}
		fmt.Fprintf(&b, "sample %d: vCPU RIPs: %s\n", i+1, strings.Join(where, "; "))
	}
	return b.String()
}
