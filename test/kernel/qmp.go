package kernel

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
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

// symbols is an address -> name table of kernel text, sorted by address.
// Debian's kernel package ships a placeholder System.map (the real one is
// in the -dbg package) and a vmlinux without a symbol table, so the table
// is the kernel's exported symbols, read from vmlinux's __ksymtab
// sections: a name is then the nearest exported symbol below an address,
// which for a static function is its neighbour (said as "near").
type symbols struct {
	addr []uint64
	name []string
}

// loadKsymtab reads the exported symbols of a vmlinux ELF file. Entries
// are prel32 (x86-64 since 4.19): {int32 value, int32 name, int32
// namespace}, each an offset from the field's own address.
func loadKsymtab(vmlinux string) (*symbols, error) {
	f, err := elf.Open(vmlinux)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	strs := f.Section("__ksymtab_strings")
	if strs == nil {
		return nil, fmt.Errorf("%s has no __ksymtab_strings", vmlinux)
	}
	strData, err := strs.Data()
	if err != nil {
		return nil, err
	}
	type sym struct {
		addr uint64
		name string
	}
	var all []sym
	for _, name := range []string{"__ksymtab", "__ksymtab_gpl"} {
		sec := f.Section(name)
		if sec == nil {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, err
		}
		for off := 0; off+12 <= len(data); off += 12 {
			at := sec.Addr + uint64(off)
			val := at + uint64(int64(int32(binary.LittleEndian.Uint32(data[off:]))))
			nameAt := at + 4 + uint64(int64(int32(binary.LittleEndian.Uint32(data[off+4:]))))
			if nameAt < strs.Addr || nameAt >= strs.Addr+uint64(len(strData)) {
				continue
			}
			n := strData[nameAt-strs.Addr:]
			if i := bytes.IndexByte(n, 0); i >= 0 {
				n = n[:i]
			}
			all = append(all, sym{val, string(n)})
		}
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%s: no exported symbols found", vmlinux)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].addr < all[j].addr })
	s := &symbols{}
	for _, x := range all {
		s.addr = append(s.addr, x.addr)
		s.name = append(s.name, x.name)
	}
	return s, nil
}

// lookup names the function holding addr ("func+0x1a"), or "" outside
// the kernel's text (a module, user space).
func (s *symbols) lookup(addr uint64) string {
	if s == nil || len(s.addr) == 0 || addr < s.addr[0] {
		return ""
	}
	i := sort.Search(len(s.addr), func(i int) bool { return s.addr[i] > addr }) - 1
	if off := addr - s.addr[i]; off < 1<<20 {
		return fmt.Sprintf("near %s+0x%x", s.name[i], off)
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
