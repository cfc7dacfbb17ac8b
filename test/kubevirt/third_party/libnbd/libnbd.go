// Package libnbd is a stand-in for libnbd's Go binding (libguestfs.org/libnbd),
// which the Go module proxy does not serve and Debian does not package. It
// has only the names KubeVirt v1.9.0's pkg/storage/nbdclient uses, so that
// virt-launcher (which imports that package) builds; every call returns an
// error. nbdclient serves changed-block-tracking backups over NBD, which
// vfnet's VM never uses: nothing the tests run reaches this code.
package libnbd

import "errors"

// errStub is what every call returns.
var errStub = errors.New("libnbd is a stand-in in vfnet's test/kubevirt (third_party/libnbd): NBD is not available")

// Metadata contexts and extent flags, with libnbd's values.
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"
	STATE_HOLE                = uint32(1)
	STATE_ZERO                = uint32(2)
	STATE_DIRTY               = uint32(1)
)

// LibnbdExtent is one extent a block-status callback receives.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// ExtentCallback64 is BlockStatus64's callback.
type ExtentCallback64 func(metacontext string, offset uint64, entries []LibnbdExtent, err *int) int

// BlockStatus64Optargs and PreadOptargs are the calls' optional arguments.
type (
	BlockStatus64Optargs struct{}
	PreadOptargs         struct{}
)

// Libnbd is a handle; the stand-in never makes one.
type Libnbd struct{}

// Create fails: there is no libnbd.
func Create() (*Libnbd, error) { return nil, errStub }

func (*Libnbd) Close() error                              { return nil }
func (*Libnbd) AddMetaContext(string) error               { return errStub }
func (*Libnbd) CanMetaContext(string) (bool, error)       { return false, errStub }
func (*Libnbd) SetExportName(string) error                { return errStub }
func (*Libnbd) ConnectUnix(string) error                  { return errStub }
func (*Libnbd) GetSize() (uint64, error)                  { return 0, errStub }
func (*Libnbd) Pread([]byte, uint64, *PreadOptargs) error { return errStub }
func (*Libnbd) BlockStatus64(uint64, uint64, ExtentCallback64, *BlockStatus64Optargs) error {
	return errStub
}
