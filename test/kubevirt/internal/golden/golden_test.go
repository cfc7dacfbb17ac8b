package golden

import (
	"bytes"
	"os"
	"testing"
)

// goldenDir is testdata/golden of this module, relative to this package.
const goldenDir = "../../testdata/golden"

// TestGoldenInputsUpToDate regenerates every case with KubeVirt's converter
// and requires the committed files to match: the inputs the binding is
// tested on must be what KubeVirt v1.9.0 really produces.
func TestGoldenInputsUpToDate(t *testing.T) {
	t.Parallel()
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			want, err := Generate(c)
			if err != nil {
				t.Fatal(err)
			}
			for path, w := range map[string][]byte{
				DomainFile(goldenDir, c.Name): want.DomainXML,
				VMIFile(goldenDir, c.Name):    want.VMIJSON,
			} {
				got, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("read committed golden input (regenerate: cd test/kubevirt && go run ./cmd/gengolden): %v", err)
				}
				if !bytes.Equal(got, w) {
					t.Errorf("%s differs from what KubeVirt v1.9.0's converter generates now; regenerate with `cd test/kubevirt && go run ./cmd/gengolden` and review the diff", path)
				}
			}
		})
	}
}

// TestGenerateIsDeterministic guards the check above against flakiness
// (map order, time, random names in the converter's output).
func TestGenerateIsDeterministic(t *testing.T) {
	t.Parallel()
	for _, c := range Cases() {
		a, err := Generate(c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Generate(c)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.DomainXML, b.DomainXML) || !bytes.Equal(a.VMIJSON, b.VMIJSON) {
			t.Errorf("case %s: two generations differ", c.Name)
		}
	}
}

// TestCasesCoverTheIssue pins the shapes issue 4 asks for, so a case cannot
// be dropped silently.
func TestCasesCoverTheIssue(t *testing.T) {
	t.Parallel()
	var pciBoot, twoPlusMasq, other bool
	for _, c := range Cases() {
		vfnet, masq := 0, 0
		for _, iface := range c.VMI.Spec.Domain.Devices.Interfaces {
			switch {
			case iface.Binding != nil && iface.Binding.Name == BindingName:
				vfnet++
				if iface.PciAddress != "" && iface.BootOrder != nil {
					pciBoot = true
				}
			case iface.Binding != nil:
				other = true
			case iface.Masquerade != nil:
				masq++
			}
		}
		if vfnet >= 2 && masq == 1 {
			twoPlusMasq = true
		}
		if c.VMI.Spec.Domain.Machine == nil || c.VMI.Spec.Domain.Machine.Type != "q35" {
			t.Errorf("case %s is not a q35 machine", c.Name)
		}
	}
	if !pciBoot || !twoPlusMasq || !other {
		t.Errorf("cases lack a shape: pciAddress+bootOrder=%v two-vfnet+masquerade=%v other-binding=%v", pciBoot, twoPlusMasq, other)
	}
}
