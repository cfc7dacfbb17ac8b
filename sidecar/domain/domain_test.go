package domain_test

import (
	"bytes"
	"context"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
)

func hostdevs(t testing.TB, doc []byte) map[string]libvirtxml.DomainHostdev {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(doc)); err != nil {
		t.Fatalf("output does not parse as a libvirt domain: %v", err)
	}
	out := map[string]libvirtxml.DomainHostdev{}
	if d.Devices == nil {
		return out
	}
	for _, h := range d.Devices.Hostdevs {
		if h.Alias == nil {
			continue
		}
		if _, dup := out[h.Alias.Name]; dup {
			t.Fatalf("alias %s appears twice", h.Alias.Name)
		}
		out[h.Alias.Name] = h
	}
	return out
}

func pciString(a *libvirtxml.DomainAddressPCI) string {
	if a == nil || a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
		return "<nil>"
	}
	return pciaddr.Address{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}.String()
}

func checkHostdev(t testing.TB, h libvirtxml.DomainHostdev, source, guest string, boot uint) {
	t.Helper()
	if h.Managed != "no" || h.SubsysPCI == nil || h.SubsysPCI.Source == nil {
		t.Fatalf("hostdev %+v: want managed=no pci subsystem with a source", h)
	}
	if got := pciString(h.SubsysPCI.Source.Address); got != source {
		t.Errorf("%s source %s, want %s", h.Alias.Name, got, source)
	}
	switch {
	case guest == "" && h.Address != nil:
		t.Errorf("%s has guest address %+v, want none", h.Alias.Name, h.Address.PCI)
	case guest != "" && (h.Address == nil || pciString(h.Address.PCI) != guest):
		t.Errorf("%s guest address %+v, want %s", h.Alias.Name, h.Address, guest)
	}
	switch {
	case boot == 0 && h.Boot != nil:
		t.Errorf("%s has boot order %d, want none", h.Alias.Name, h.Boot.Order)
	case boot != 0 && (h.Boot == nil || h.Boot.Order != boot):
		t.Errorf("%s boot %+v, want order %d", h.Alias.Name, h.Boot, boot)
	}
}

// applyVMI is what the hook server does with a VMI: its binding's
// interfaces, then Apply.
func applyVMI(in []byte, vmi *vmiview.VMI, bindingName string, reader domain.MetadataReader) ([]byte, error) {
	ifaces, err := vmi.BindingInterfaces(bindingName)
	if err != nil {
		return nil, err
	}
	return domain.Apply(context.Background(), in, ifaces, reader, nil)
}

func apply(t testing.TB, in []byte, vmi *kubevirtv1.VirtualMachineInstance, root string) []byte {
	t.Helper()
	out, err := applyVMI(in, kubevirtvmi.View(vmi), binding, metadata.FileReader{Root: root})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return out
}

func TestQ35WithoutAddressOrBoot(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "02:00:00:00:00:01")
	vmi := newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02:00:00:00:00:01" }).Build()
	in := readTestdata(t, "q35.xml")
	out := apply(t, in, vmi, root)

	block := insertion(t, in, out)
	if bytes.Count(block, []byte("<hostdev ")) != 1 {
		t.Errorf("inserted block is not one hostdev:\n%q", block)
	}
	// After the last device, at the indentation of its siblings.
	if !bytes.Contains(out, []byte("</rng>\n\t\t<hostdev mode=\"subsystem\" type=\"pci\" managed=\"no\">\n\t\t\t<source>")) ||
		!bytes.Contains(out, []byte("</alias>\n\t\t</hostdev>\n\t</devices>")) {
		t.Errorf("hostdev not laid out like its siblings:\n%s", out)
	}
	hs := hostdevs(t, out)
	if len(hs) != 1 {
		t.Fatalf("hostdevs %v, want exactly ua-sriov-dra-net", hs)
	}
	checkHostdev(t, hs["ua-sriov-dra-net"], "0000:3b:02.1", "", 0)
	validate(t, out)
}

func TestQ35WithAddressAndBoot(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:af:10.7", "")
	boot := uint(1)
	vmi := newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) {
		i.PciAddress, i.BootOrder = "0000:0A:01.0", &boot
	}).Build()
	in := readTestdata(t, "q35.xml")
	out := apply(t, in, vmi, root)
	insertion(t, in, out)
	checkHostdev(t, hostdevs(t, out)["ua-sriov-dra-net"], "0000:af:10.7", "0000:0a:01.0", 1)
	validate(t, out)
}

func TestTwoVFsMasqueradeAndOtherBinding(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net-a", "vf", "0000:3b:02.1", "02:00:00:00:00:0a")
	writeVF(t, root, "net-b", "vf", "0000:3b:02.2", "02:00:00:00:00:0b")
	vmi := newVMI().
		VFNet("data-a", "net-a", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02:00:00:00:00:0A" }).
		Other("tap-net", "passt").
		VFNet("data-b", "net-b", "vf", nil).
		Build()
	in := readTestdata(t, "q35.xml")
	out := apply(t, in, vmi, root)
	block := insertion(t, in, out)
	if i, j := bytes.Index(block, []byte("ua-sriov-data-a")), bytes.Index(block, []byte("ua-sriov-data-b")); i < 0 || j < i {
		t.Errorf("hostdevs not in interface order:\n%s", block)
	}
	hs := hostdevs(t, out)
	if len(hs) != 2 {
		t.Fatalf("hostdevs %v: want two, none for the masquerade or passt interface", hs)
	}
	checkHostdev(t, hs["ua-sriov-data-a"], "0000:3b:02.1", "", 0)
	checkHostdev(t, hs["ua-sriov-data-b"], "0000:3b:02.2", "", 0)
	validate(t, out)
}

func TestNoBindingInterfaceLeavesDomainAlone(t *testing.T) {
	t.Parallel()
	vmi := newVMI().Other("tap-net", "passt").Build()
	in := readTestdata(t, "q35.xml")
	out := apply(t, in, vmi, t.TempDir())
	if !bytes.Equal(in, out) {
		t.Errorf("domain changed for a VMI without vfnet interfaces")
	}
}

func TestDirectClaimUsesResourceClaimName(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	c := metadata.ClaimPath(root, "shared-vf-claim", "vf")
	writeAt(t, c, "0000:3b:03.0")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).Direct("net", "shared-vf-claim").Build()
	out := apply(t, readTestdata(t, "q35.xml"), vmi, root)
	checkHostdev(t, hostdevs(t, out)["ua-sriov-dra-net"], "0000:3b:03.0", "", 0)
}

// Three calls give what one call gives, for every shape of input the
// launcher can hand back (it re-marshals our output between calls).
func TestIdempotent(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net-a", "vf", "0000:3b:02.1", "")
	writeVF(t, root, "net-b", "vf", "0000:3b:02.2", "")
	boot := uint(2)
	vmi := newVMI().VFNet("data-a", "net-a", "vf", func(i *kubevirtv1.Interface) { i.PciAddress, i.BootOrder = "0000:09:00.0", &boot }).
		VFNet("data-b", "net-b", "vf", nil).Build()
	for _, name := range []string{"q35.xml", "compact.xml", "selfclosing-devices.xml", "no-devices.xml"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := readTestdata(t, name)
			once := apply(t, in, vmi, root)
			thrice := apply(t, apply(t, once, vmi, root), vmi, root)
			if !bytes.Equal(once, thrice) {
				t.Errorf("three calls differ from one:\n--- one:\n%s\n--- three:\n%s", once, thrice)
			}
			hs := hostdevs(t, thrice)
			checkHostdev(t, hs["ua-sriov-data-a"], "0000:3b:02.1", "0000:09:00.0", 2)
			checkHostdev(t, hs["ua-sriov-data-b"], "0000:3b:02.2", "", 0)
			validate(t, thrice)
		})
	}
}

// An earlier hostdev with our alias is replaced in place even when the
// launcher reformatted it, pointed at an old VF, or duplicated it; KubeVirt's
// own SR-IOV hostdev and unknown elements stay exactly as they were.
func TestReplaceByAlias(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
	in := readTestdata(t, "earlier-call.xml")
	out := apply(t, in, vmi, root)
	hs := hostdevs(t, out)
	checkHostdev(t, hs["ua-sriov-dra-net"], "0000:3b:02.1", "", 0)
	checkHostdev(t, hs["ua-sriov-kubevirt-sriov"], "0000:5e:00.3", "", 0)
	if n := bytes.Count(out, []byte(`"ua-sriov-dra-net"`)); n != 1 {
		t.Errorf("alias ua-sriov-dra-net appears %d times", n)
	}
	for _, keep := range []string{
		`<qemu:commandline>`, `<qemu:arg value="-fw_cfg"></qemu:arg>`, `<vfnet-test-unknown flavour="kept">text</vfnet-test-unknown>`,
		`<kubevirt xmlns="http://kubevirt.io">`, `<hostdev-note>unknown child kept</hostdev-note>`, `<!-- a comment survives -->`,
	} {
		if !bytes.Contains(out, []byte(keep)) {
			t.Errorf("output lost %s", keep)
		}
	}
	if bytes.Contains(out, []byte("0000:3b:09.")) || bytes.Contains(out, []byte(`bus="0x3b" slot="0x09"`)) {
		t.Errorf("stale VF address survived:\n%s", out)
	}
	again := apply(t, out, vmi, root)
	if !bytes.Equal(out, again) {
		t.Errorf("second call changed the output")
	}
}

// libvirtxml alone would drop unknown elements and rewrite the qemu:
// prefix; the splice keeps every input byte.
func TestPreservesEverythingElse(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
	in := readTestdata(t, "unknown-elements.xml")
	block := insertion(t, in, apply(t, in, vmi, root))
	if bytes.Count(block, []byte("<hostdev ")) != 1 {
		t.Errorf("inserted %q, want one hostdev", block)
	}
}
