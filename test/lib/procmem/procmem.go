// Package procmem reads a process's memory figures the way vfnet's memory
// tests and benchmarks report them: the kB fields of /proc/<pid>/status
// (VmRSS = RssAnon + RssFile + RssShmem, VmHWM its peak), the resident kB of
// each mapping kind in /proc/<pid>/smaps, and the Go runtime's own figures
// from a Prometheus /metrics endpoint; and its CPU time.
package procmem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vfnet-io/vfnet/test/lib/scrape"
)

// Status returns the kB fields of /proc/<pid>/status ("VmRSS", "RssAnon",
// "RssFile", ...). A status without VmRSS is an error.
func Status(pid int) (map[string]int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "kB" {
			n, _ := strconv.Atoi(f[1])
			out[strings.TrimSuffix(f[0], ":")] = n
		}
	}
	if out["VmRSS"] == 0 {
		return nil, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return out, nil
}

// Smaps sums the Rss of /proc/<pid>/smaps per mapping kind (permissions and
// file name, or "anon") and returns "smaps Rss: [r-xp file] 12.7 MiB ..."
// for every kind of at least 256 kB, in the order they first appear.
func Smaps(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return "", err
	}
	rss := map[string]int{}
	var order []string
	name := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			name = f[1] // perms
			if len(f) >= 6 {
				name += " " + filepath.Base(f[5])
			} else {
				name += " anon"
			}
			if _, ok := rss[name]; !ok {
				order = append(order, name)
			}
		case len(f) == 3 && f[0] == "Rss:":
			n, _ := strconv.Atoi(f[1])
			rss[name] += n
		}
	}
	var b strings.Builder
	b.WriteString("smaps Rss:")
	for _, n := range order {
		if rss[n] >= 256 {
			fmt.Fprintf(&b, " [%s] %.1f MiB", n, float64(rss[n])/1024)
		}
	}
	return b.String(), nil
}

// GoRuntime scrapes metricsURL and returns "; Go runtime: heap_alloc 11.4
// MiB ... goroutines 36" from the go_memstats_* and go_goroutines series a
// Go program's Prometheus registry exports (series it lacks are left out).
func GoRuntime(ctx context.Context, metricsURL string) (string, error) {
	f, err := scrape.Get(ctx, http.DefaultClient, metricsURL)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("; Go runtime:")
	for _, m := range []string{"heap_alloc", "heap_inuse", "heap_idle", "heap_released", "stack_inuse", "sys", "other_sys", "gc_sys", "mspan_inuse"} {
		if v, ok := f.Value("go_memstats_"+m+"_bytes", nil); ok {
			fmt.Fprintf(&b, " %s %.1f MiB", m, v/(1<<20))
		}
	}
	if v, ok := f.Value("go_goroutines", nil); ok {
		fmt.Fprintf(&b, " goroutines %.0f", v)
	}
	return b.String(), nil
}

// CPU is a process's user+system time from /proc/<pid>/stat.
func CPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces: fields follow the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	// Fields 14 and 15 (utime, stime) are at 11 and 12 after the name;
	// USER_HZ is 100 on every Linux ABI Go supports.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
