package domain_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/metadatatest"
)

// Every failure names the interface, the claim and request, the file where
// one is involved, and what to fix.
func TestErrors(t *testing.T) {
	t.Parallel()
	claim := metadatatest.Claim{Namespace: "vms", Name: "vm-a-net-x7k2q", PodClaimName: "net", Request: "vf"}
	write := func(t *testing.T, root string, data []byte) string {
		p := metadata.TemplateClaimPath(root, "net", "vf")
		if err := metadatatest.Write(p, data); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := func() *kubevirtv1.VirtualMachineInstance { return newVMI().VFNet("dra-net", "net", "vf", nil).Build() }
	cases := []struct {
		name    string
		setup   func(t *testing.T, root string) string // returns the file to be named, if any
		vmi     func() *kubevirtv1.VirtualMachineInstance
		xml     string
		want    []string
		invalid bool
	}{{
		name:  "metadata directory missing",
		setup: func(t *testing.T, root string) string { return metadata.TemplateClaimPath(root, "net", "vf") },
		want:  []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "v1.10", "18741", "upgrade KubeVirt", "does not exist", "CDI", "enable_cdi = true"},
	}, {
		name: "request directory missing",
		setup: func(t *testing.T, root string) string {
			if err := os.MkdirAll(filepath.Join(root, "resourceclaimtemplates", "net", "other-request"), 0o755); err != nil {
				t.Fatal(err)
			}
			return metadata.TemplateClaimPath(root, "net", "vf")
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "requestName"},
	}, {
		name: "file missing, another driver's file present",
		setup: func(t *testing.T, root string) string {
			p := metadata.TemplateClaimPath(root, "net", "vf")
			other := filepath.Join(filepath.Dir(p), "gpu.example.com-metadata.json")
			if err := metadatatest.Write(other, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			return p
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "gpu.example.com", "vfnet DeviceClass"},
	}, {
		name: "file missing in a mounted request directory",
		setup: func(t *testing.T, root string) string {
			p := metadata.TemplateClaimPath(root, "net", "vf")
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "vfnet-driver logs"},
	}, {
		name: "two devices",
		setup: func(t *testing.T, root string) string {
			return write(t, root, metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", ""), metadatatest.VF("0000:3b:02.2", "")))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "2 devices", "count: 1"},
	}, {
		name: "other driver",
		setup: func(t *testing.T, root string) string {
			return write(t, root, metadatatest.Stream(claim, metadatatest.Device{Driver: "gpu.example.com", Name: "gpu-0", PCIBusID: "0000:3b:02.1"}))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, `"gpu.example.com"`, "vfnet DeviceClass"},
	}, {
		name: "no pciBusID",
		setup: func(t *testing.T, root string) string {
			return write(t, root, metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x"}))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "resource.kubernetes.io/pciBusID"},
	}, {
		name: "malformed pciBusID",
		setup: func(t *testing.T, root string) string {
			return write(t, root, metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3b:22.9"}))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "pciBusID", "PCI slot 22 is beyond 1f", "damaged"},
	}, {
		// pciaddr's domain rule: QEMU's vfio-pci would refuse the hostdev.
		name: "pciBusID beyond domain ffff",
		setup: func(t *testing.T, root string) string {
			return write(t, root, metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "10000:3b:02.1"}))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, `pciBusID "10000:3b:02.1"`, "PCI domain 10000 is beyond ffff", "QEMU's vfio-pci"},
	}, {
		name: "garbage file",
		setup: func(t *testing.T, root string) string {
			return write(t, root, []byte(`{"kind":`))
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "decode"},
	}, {
		name: "MAC mismatch",
		setup: func(t *testing.T, root string) string {
			write(t, root, metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", "02:00:00:00:00:99")))
			return ""
		},
		vmi: func() *kubevirtv1.VirtualMachineInstance {
			return newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02-00-00-00-00-01" }).Build()
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "02:00:00:00:00:99", "02-00-00-00-00-01", "VFConfig"},
	}, {
		name:  "network not a resourceClaim",
		setup: func(t *testing.T, root string) string { return "" },
		vmi: func() *kubevirtv1.VirtualMachineInstance {
			v := newVMI().Build()
			v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "dra-net", Binding: &kubevirtv1.PluginBinding{Name: binding}})
			v.Spec.Networks = append(v.Spec.Networks, kubevirtv1.Network{Name: "dra-net", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "x"}}})
			return v
		},
		want: []string{`interface "dra-net"`, "not a resourceClaim network", "resourceClaim {claimName, requestName}"},
	}, {
		name: "bad guest pciAddress",
		setup: func(t *testing.T, root string) string {
			write(t, root, metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", "")))
			return ""
		},
		vmi: func() *kubevirtv1.VirtualMachineInstance {
			return newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.PciAddress = "0000:3b:02" }).Build()
		},
		want: []string{`interface "dra-net"`, `claim "net"`, `request "vf"`, "pciAddress"},
	}, {
		name:  "interface name unusable in an alias",
		setup: func(t *testing.T, root string) string { return "" },
		vmi: func() *kubevirtv1.VirtualMachineInstance {
			return newVMI().VFNet("dra.net", "net", "vf", nil).Build()
		},
		want: []string{`interface "dra.net"`, `claim "net"`, "rename the interface"},
	}, {
		name: "same VF behind two interfaces",
		setup: func(t *testing.T, root string) string {
			write(t, root, metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", "")))
			return ""
		},
		vmi: func() *kubevirtv1.VirtualMachineInstance {
			v := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
			v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "dra-net2", Binding: &kubevirtv1.PluginBinding{Name: binding}})
			v.Spec.Networks = append(v.Spec.Networks, kubevirtv1.Network{Name: "dra-net2", NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: "net", RequestName: "vf"}}})
			return v
		},
		want: []string{`interface "dra-net2"`, "0000:3b:02.1", `"dra-net"`, "own claim request"},
	}, {
		name:    "domain XML not well-formed",
		setup:   func(t *testing.T, root string) string { return "" },
		xml:     `<domain type="kvm"><devices></domain>`,
		want:    []string{"not well-formed", "<devices> closed by </domain>"},
		invalid: true,
	}, {
		name:    "domain XML not closed",
		setup:   func(t *testing.T, root string) string { return "" },
		xml:     `<domain type="kvm"><devices></devices>`,
		want:    []string{"not well-formed", "<domain> is not closed"},
		invalid: true,
	}, {
		name:    "prefixed end element",
		setup:   func(t *testing.T, root string) string { return "" },
		xml:     `<domain type="kvm" xmlns:qemu="urn:q"><qemu:commandline></commandline></domain>`,
		want:    []string{"not well-formed", "<qemu:commandline> closed by </commandline>"},
		invalid: true,
	}, {
		name:    "not a domain",
		setup:   func(t *testing.T, root string) string { return "" },
		xml:     `<network><name>x</name></network>`,
		want:    []string{"root element is <network>"},
		invalid: true,
	}, {
		name:    "empty domain",
		setup:   func(t *testing.T, root string) string { return "" },
		xml:     " \n",
		want:    []string{"empty"},
		invalid: true,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			file := c.setup(t, root)
			vmi := plain()
			if c.vmi != nil {
				vmi = c.vmi()
			}
			in := readTestdata(t, "q35.xml")
			if c.xml != "" {
				in = []byte(c.xml)
			}
			out, err := applyVMI(in, kubevirtvmi.View(vmi), binding, metadata.FileReader{Root: root})
			if err == nil {
				t.Fatalf("no error; output:\n%s", out)
			}
			want := c.want
			if file != "" {
				want = append(want, file)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
			var invalid *domain.InvalidInputError
			if errors.As(err, &invalid) != c.invalid {
				t.Errorf("InvalidInputError = %v, want %v (%v)", !c.invalid, c.invalid, err)
			}
		})
	}
}

// The MAC check compares addresses, not spellings.
func TestMACComparedNormalized(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "02:AB:cd:00:00:01")
	vmi := newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02-ab-CD-00-00-01" }).Build()
	if _, err := applyVMI(readTestdata(t, "q35.xml"), kubevirtvmi.View(vmi), binding, metadata.FileReader{Root: root}); err != nil {
		t.Fatal(err)
	}
}
