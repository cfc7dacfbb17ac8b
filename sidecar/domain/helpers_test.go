package domain_test

import (
	"path/filepath"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
)

const binding = sidecartest.Binding

var (
	newVMI    = sidecartest.NewVMI
	writeVF   = sidecartest.WriteVF
	writeFO   = sidecartest.WriteFailoverVF
	writeAt   = sidecartest.WriteDirect
	validate  = sidecartest.Validate
	insertion = sidecartest.Insertion
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	return sidecartest.ReadFile(t, filepath.Join("testdata", name))
}
