package domain_test

import (
	"bytes"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"
)

// rootPortHotplug maps each pcie-root-port's index to its hotplug setting.
func rootPortHotplug(t *testing.T, doc []byte) map[uint]string {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(doc)); err != nil {
		t.Fatalf("output does not parse as a libvirt domain: %v", err)
	}
	out := map[uint]string{}
	for _, c := range d.Devices.Controllers {
		if c.Type != "pci" || c.Model != "pcie-root-port" || c.Index == nil {
			continue
		}
		out[*c.Index] = ""
		if c.PCI != nil && c.PCI.Target != nil {
			out[*c.Index] = c.PCI.Target.Hotplug
		}
	}
	return out
}

// The domain as KubeVirt after v1.9.0 (PR 17605) hands it over when it
// switched off hot-plug on every occupied root port: port 1 holds a
// virtio-serial controller, port 2 the VF's hostdev where libvirt put it
// on the previous define, port 3 KubeVirt's own SR-IOV hostdev, port 5 is
// where the second VF's pciAddress puts it. Only the VFs' ports change,
// and only by losing the attribute.
func TestVFRootPortsKeptHotpluggable(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "")
	writeVF(t, root, "net2", "vf", "0000:3b:02.2", "")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).
		VFNet("second", "net2", "vf", func(i *kubevirtv1.Interface) { i.PciAddress = "0000:05:00.0" }).Build()
	in := readTestdata(t, "hotplug-off.xml")
	out := apply(t, in, vmi, root)

	got := rootPortHotplug(t, out)
	want := map[uint]string{1: "off", 2: "", 3: "off", 4: "", 5: ""}
	for i, h := range want {
		if got[i] != h {
			t.Errorf("root port %d hotplug=%q, want %q (all: %v)", i, got[i], h, got)
		}
	}
	for _, s := range []string{`<target chassis="2" port="0x9"/>`, "index=\"5\" model=\"pcie-root-port\">\n\t\t\t<target></target>"} {
		if !bytes.Contains(out, []byte(s)) {
			t.Errorf("output lacks %q: only the attribute goes\n%s", s, out)
		}
	}
	// Apart from the two attributes, the output is what the hostdev
	// splice alone makes of the input.
	without := strings.Replace(string(in), ` hotplug="off" port`, ` port`, 1)
	without = strings.Replace(without, "\n\t\t\t\thotplug = 'off'>", ">", 1)
	if alone := apply(t, []byte(without), vmi, root); !bytes.Equal(out, alone) {
		t.Errorf("output differs from the input's splice by more than the two attributes:\n--- got:\n%s\n--- want:\n%s", out, alone)
	}
	hs := hostdevs(t, out)
	checkHostdev(t, hs["ua-sriov-dra-net"], "0000:3b:02.1", "", 0)
	checkHostdev(t, hs["ua-sriov-second"], "0000:3b:02.2", "0000:05:00.0", 0)
	checkHostdev(t, hs["ua-sriov-kubevirt-sriov"], "0000:5e:00.3", "0000:03:00.0", 0)
	if again := apply(t, out, vmi, root); !bytes.Equal(out, again) {
		t.Errorf("second call changed the output")
	}
	validate(t, out)
}

// A port the VF shares with another device keeps KubeVirt's setting, and a
// VMI without vfnet interfaces leaves every port as it is.
func TestRootPortHotplugLeftAlone(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeVF(t, root, "net", "vf", "0000:3b:02.1", "")
	in := readTestdata(t, "hotplug-off.xml")
	shared := bytes.Replace(in, []byte("\t</devices>"), []byte("\t\t<watchdog model=\"i6300esb\" action=\"reset\">\n"+
		"\t\t\t<address type=\"pci\" domain=\"0x0000\" bus=\"0x02\" slot=\"0x00\" function=\"0x1\"></address>\n\t\t</watchdog>\n\t</devices>"), 1)
	out := apply(t, shared, newVMI().VFNet("dra-net", "net", "vf", nil).Build(), root)
	if got := rootPortHotplug(t, out)[2]; got != "off" {
		t.Errorf("root port 2, shared with a watchdog, has hotplug=%q, want KubeVirt's off", got)
	}
	if out := apply(t, in, newVMI().Other("tap-net", "passt").Build(), root); !bytes.Equal(in, out) {
		t.Errorf("domain changed for a VMI without vfnet interfaces")
	}
}
