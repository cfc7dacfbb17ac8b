package kernel

import (
	"bufio"
	"io"
	"strings"
)

// The guest's init frames each case on the serial console:
//
//	VFNET-CASE <name> BEGIN
//	... the case's own output (go test -test.v) ...
//	VFNET-CASE <name> PASS|FAIL|SKIP [words]
//	VFNET-DONE
//
// Kernel messages may be interleaved anywhere; they stay in the case's
// output, where they help explain a failure.
const (
	MarkCase = "VFNET-CASE"
	MarkDone = "VFNET-DONE"
)

// Result is what one case reported.
type Result struct {
	Name string
	// Status is PASS, FAIL or SKIP; "" when the case began but never ended
	// (the guest died or hung).
	Status string
	// Detail is the rest of the result line.
	Detail string
	// Output is everything the console showed between BEGIN and the result.
	Output string
}

// Console is a parsed console log.
type Console struct {
	Results []Result
	// Done is true when the guest's init reached its end.
	Done bool
}

// Case finds a case's result by name.
func (c *Console) Case(name string) (Result, bool) {
	for _, r := range c.Results {
		if r.Name == name {
			return r, true
		}
	}
	return Result{}, false
}

// ParseConsole reads a console log. The marks may be preceded by other text
// on their line (a serial console has no line discipline between writers).
func ParseConsole(r io.Reader) (*Console, error) {
	c := &Console{}
	var cur *Result
	var out strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if i := strings.Index(line, MarkDone); i >= 0 && strings.TrimSpace(line[i+len(MarkDone):]) == "" {
			c.Done = true
			continue
		}
		i := strings.Index(line, MarkCase+" ")
		if i < 0 {
			if cur != nil {
				out.WriteString(line)
				out.WriteByte('\n')
			}
			continue
		}
		if cur != nil && i > 0 {
			out.WriteString(line[:i])
			out.WriteByte('\n')
		}
		f := strings.Fields(line[i+len(MarkCase):])
		if len(f) < 2 {
			continue
		}
		name, status := f[0], f[1]
		switch status {
		case "BEGIN":
			if cur != nil { // the previous case never ended
				cur.Output = out.String()
				c.Results = append(c.Results, *cur)
			}
			cur = &Result{Name: name}
			out.Reset()
		case "PASS", "FAIL", "SKIP":
			if cur == nil || cur.Name != name {
				cur = &Result{Name: name}
				out.Reset()
			}
			cur.Status = status
			cur.Detail = strings.Join(f[2:], " ")
			cur.Output = out.String()
			c.Results = append(c.Results, *cur)
			cur = nil
			out.Reset()
		}
	}
	if cur != nil {
		cur.Output = out.String()
		c.Results = append(c.Results, *cur)
	}
	return c, sc.Err()
}
