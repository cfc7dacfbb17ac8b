package procmem

import (
	"os"
	"strings"
	"testing"
)

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	st, err := Status(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st["VmRSS"] <= 0 || st["VmHWM"] < st["VmRSS"] || st["RssAnon"]+st["RssFile"] > st["VmRSS"] {
		t.Errorf("implausible status: VmRSS %d VmHWM %d RssAnon %d RssFile %d kB", st["VmRSS"], st["VmHWM"], st["RssAnon"], st["RssFile"])
	}
	s, err := Smaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, "smaps Rss: [") || !strings.Contains(s, " MiB") {
		t.Errorf("smaps summary %q", s)
	}
	if _, err := CPU(pid); err != nil {
		t.Fatal(err)
	}
	if _, err := Status(-1); err == nil {
		t.Error("Status(-1): no error")
	}
}
