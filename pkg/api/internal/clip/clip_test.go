package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	t.Parallel()
	if got := String("short", 0); got != "short" {
		t.Fatalf("short value changed: %q", got)
	}
	exact := strings.Repeat("a", Max)
	if got := String(exact, 0); got != exact {
		t.Fatalf("value of exactly Max bytes changed: %q", got)
	}
	long := strings.Repeat("x", 1<<20)
	got := String(long, 0)
	if len(got) > Max+32 || !strings.HasPrefix(got, strings.Repeat("x", Max)) || !strings.HasSuffix(got, "...(1048512 more bytes)") {
		t.Fatalf("1 MiB value clipped to %d bytes: %q", len(got), got)
	}
	// A cut never splits a rune: the result stays valid UTF-8.
	multi := strings.Repeat("é", 100) // 2 bytes each
	got = String(multi, 5)
	if !utf8.ValidString(got) || !strings.HasPrefix(got, "éé...(") {
		t.Fatalf("multibyte cut: %q", got)
	}
	if q := Quote(long, 8); q != `"xxxxxxxx...(1048568 more bytes)"` {
		t.Fatalf("Quote: %s", q)
	}
}
