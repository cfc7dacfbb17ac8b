// Package clip bounds the size of user-supplied values that error messages
// echo back: a claim can carry megabytes of JSON, and an error that repeats
// it whole floods the kubelet log, the claim's status and Events.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// Max is the default number of bytes of a value an error shows.
const Max = 64

// String returns s when it is at most max bytes long; otherwise its first
// max bytes (cut at a rune boundary) followed by a note of how many bytes
// were left out. max <= 0 means Max.
func String(s string, max int) string {
	if max <= 0 {
		max = Max
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...(" + strconv.Itoa(len(s)-cut) + " more bytes)"
}

// Quote is strconv.Quote of String(s, max): the form errors use with %q.
func Quote(s string, max int) string { return strconv.Quote(String(s, max)) }
