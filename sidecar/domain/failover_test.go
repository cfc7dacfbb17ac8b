package domain_test

import (
	"bytes"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/standby"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
)

// standbys maps the alias of every <interface> vfnet's standby alias
// prefix marks to the interface.
func standbys(t testing.TB, doc []byte) map[string]libvirtxml.DomainInterface {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(doc)); err != nil {
		t.Fatalf("output does not parse as a libvirt domain: %v", err)
	}
	out := map[string]libvirtxml.DomainInterface{}
	if d.Devices == nil {
		return out
	}
	for _, i := range d.Devices.Interfaces {
		if i.Alias == nil || !strings.HasPrefix(i.Alias.Name, standby.AliasPrefix) {
			continue
		}
		if _, dup := out[i.Alias.Name]; dup {
			t.Fatalf("standby alias %s appears twice", i.Alias.Name)
		}
		out[i.Alias.Name] = i
	}
	return out
}

// checkStandby checks the standby of VMI interface iface: an ethernet
// interface on the derived tap, unmanaged, with the VF's MAC, a virtio
// model, persistent teaming and no ROM.
func checkStandby(t testing.TB, i libvirtxml.DomainInterface, iface, mac string) {
	t.Helper()
	dev := standby.TargetDev(iface)
	switch {
	case i.Source == nil || i.Source.Ethernet == nil:
		t.Errorf("standby of %s is not type ethernet: %+v", iface, i.Source)
	case i.MAC == nil || !strings.EqualFold(i.MAC.Address, mac):
		t.Errorf("standby of %s MAC %+v, want %s", iface, i.MAC, mac)
	case i.Target == nil || i.Target.Dev != dev || i.Target.Managed != "no":
		t.Errorf("standby of %s target %+v, want dev %s managed no", iface, i.Target, dev)
	case len(dev) > standby.MaxIfNameLen:
		t.Errorf("standby tap %q is longer than %d bytes", dev, standby.MaxIfNameLen)
	case i.Model == nil || i.Model.Type != "virtio":
		t.Errorf("standby of %s model %+v, want virtio", iface, i.Model)
	case i.Teaming == nil || i.Teaming.Type != "persistent" || i.Teaming.Persistent != "":
		t.Errorf("standby of %s teaming %+v, want type persistent", iface, i.Teaming)
	case i.ROM == nil || i.ROM.Enabled != "no":
		t.Errorf("standby of %s rom %+v, want enabled no", iface, i.ROM)
	case i.Alias == nil || i.Alias.Name != "ua-vfnet-sb-"+iface:
		t.Errorf("standby of %s alias %+v", iface, i.Alias)
	}
}

// Only the failover interface gets a standby, right after its hostdev,
// with the VF's MAC from the metadata; its hostdev stays plain (no
// teaming); the document validates against libvirt's schema.
func TestFailoverStandby(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFO(t, root, "net-a", "vf", "0000:3b:02.1", "02:00:00:00:00:0a")
	writeVF(t, root, "net-b", "vf", "0000:3b:02.2", "02:00:00:00:00:0b")
	vmi := newVMI().VFNet("data-a", "net-a", "vf", nil).VFNet("data-b", "net-b", "vf", nil).Build()
	in := readTestdata(t, "q35.xml")
	out := apply(t, in, vmi, root)
	block := insertion(t, in, out)
	hdA, sbA, hdB := bytes.Index(block, []byte(`"ua-sriov-data-a"`)), bytes.Index(block, []byte(`"ua-vfnet-sb-data-a"`)), bytes.Index(block, []byte(`"ua-sriov-data-b"`))
	if hdA < 0 || sbA < hdA || hdB < sbA {
		t.Errorf("want hostdev a, its standby, hostdev b in that order:\n%s", block)
	}
	if !bytes.Contains(block, []byte("\n\t\t<interface type=\"ethernet\">\n\t\t\t<mac address=\"02:00:00:00:00:0a\"></mac>\n")) {
		t.Errorf("standby not laid out like its siblings:\n%s", block)
	}
	if bytes.Contains(block, []byte("transient")) || bytes.Count(block, []byte("<teaming ")) != 1 {
		t.Errorf("the hostdev must stay plain (no transient teaming):\n%s", block)
	}
	sbs := standbys(t, out)
	if len(sbs) != 1 {
		t.Fatalf("standbys %v, want only ua-vfnet-sb-data-a", sbs)
	}
	checkStandby(t, sbs["ua-vfnet-sb-data-a"], "data-a", "02:00:00:00:00:0a")
	hs := hostdevs(t, out)
	checkHostdev(t, hs["ua-sriov-data-a"], "0000:3b:02.1", "", 0)
	checkHostdev(t, hs["ua-sriov-data-b"], "0000:3b:02.2", "", 0)
	validate(t, out)
}

// Without networkData.hardwareAddress the interface's macAddress is the
// VF's MAC; with neither the standby cannot be built and Apply says what
// to set.
func TestFailoverMACSources(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFO(t, root, "net", "vf", "0000:3b:02.1", "")
	withMAC := newVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) { i.MacAddress = "02:00:00:00:00:0C" }).Build()
	out := apply(t, readTestdata(t, "q35.xml"), withMAC, root)
	checkStandby(t, standbys(t, out)["ua-vfnet-sb-dra-net"], "dra-net", "02:00:00:00:00:0c")
	validate(t, out)

	noMAC := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
	_, err := applyVMI(readTestdata(t, "q35.xml"), kubevirtvmi.View(noMAC), binding, metadata.FileReader{Root: root})
	if err == nil {
		t.Fatal("a failover standby was built without a MAC")
	}
	for _, want := range []string{`interface "dra-net"`, metadata.FailoverAttribute, "macAddress", "VFConfig.mac"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// Repeated calls replace the standby, never add a second one: on our own
// output in every layout, and on the domain as libvirt hands it back
// (re-marshalled, with a PCI address libvirt gave the standby).
func TestFailoverIdempotent(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFO(t, root, "net", "vf", "0000:3b:02.1", "02:00:00:00:00:01")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
	for _, name := range []string{"q35.xml", "compact.xml", "selfclosing-devices.xml", "no-devices.xml"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			once := apply(t, readTestdata(t, name), vmi, root)
			thrice := apply(t, apply(t, once, vmi, root), vmi, root)
			if !bytes.Equal(once, thrice) {
				t.Errorf("three calls differ from one:\n--- one:\n%s\n--- three:\n%s", once, thrice)
			}
			checkStandby(t, standbys(t, thrice)["ua-vfnet-sb-dra-net"], "dra-net", "02:00:00:00:00:01")
			validate(t, thrice)

			var d libvirtxml.Domain
			if err := d.Unmarshal(string(once)); err != nil {
				t.Fatal(err)
			}
			for i := range d.Devices.Interfaces {
				if a := d.Devices.Interfaces[i].Alias; a != nil && a.Name == "ua-vfnet-sb-dra-net" {
					bus, slot, zero := uint(7), uint(0), uint(0)
					d.Devices.Interfaces[i].Address = &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: &zero, Bus: &bus, Slot: &slot, Function: &zero}}
				}
			}
			back, err := d.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			again := apply(t, []byte(back), vmi, root)
			if n := bytes.Count(again, []byte(`"ua-vfnet-sb-dra-net"`)); n != 1 {
				t.Errorf("standby alias appears %d times after a call on libvirt's read-back:\n%s", n, again)
			}
			checkStandby(t, standbys(t, again)["ua-vfnet-sb-dra-net"], "dra-net", "02:00:00:00:00:01")
		})
	}
}

// An <interface> that is not ours but carries the standby's alias (KubeVirt
// names a VMI interface "vfnet-sb-dra-net" ua-vfnet-sb-dra-net) is never
// replaced: Apply refuses and says to rename.
func TestFailoverAliasCollisionRefused(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFO(t, root, "net", "vf", "0000:3b:02.1", "02:00:00:00:00:01")
	vmi := newVMI().VFNet("dra-net", "net", "vf", nil).Build()
	in := bytes.Replace(readTestdata(t, "q35.xml"), []byte(`<alias name="ua-default">`), []byte(`<alias name="ua-vfnet-sb-dra-net">`), 1)
	if bytes.Equal(in, readTestdata(t, "q35.xml")) {
		t.Fatal("q35.xml has no ua-default interface alias to rename: the test needs one")
	}
	_, err := applyVMI(in, kubevirtvmi.View(vmi), binding, metadata.FileReader{Root: root})
	if err == nil || !strings.Contains(err.Error(), "ua-vfnet-sb-dra-net") || !strings.Contains(err.Error(), "rename") {
		t.Fatalf("Apply = %v, want a refusal naming the alias and the fix", err)
	}
}
