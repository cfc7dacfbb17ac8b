// Package sample is a module the testreport tests run the real go test on:
// each outcome is switched on by an environment variable.
package sample

import (
	"os"
	"testing"
)

func TestPass(t *testing.T) { t.Log("quiet unless verbose") }

func TestMaybeSkip(t *testing.T) {
	if os.Getenv("SAMPLE_SKIP") == "1" {
		t.Skip("no frobnicator here")
	}
}

func TestSub(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			if name == "b" && os.Getenv("SAMPLE_SUBSKIP") == "1" {
				t.Skip("subtest b skipped")
			}
		})
	}
}

func TestMaybeFail(t *testing.T) {
	if os.Getenv("SAMPLE_FAIL") == "1" {
		t.Error("the widget broke")
	}
}
