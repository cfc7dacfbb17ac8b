package pcieports

import "testing"

func TestAnalyze(t *testing.T) {
	// Shaped as libvirt 11.3 returns a q35 domain (inactive XML).
	const dom = `<domain type='qemu'><devices>
  <controller type='pci' index='0' model='pcie-root'/>
  <controller type='pci' index='1' model='pcie-root-port'><model name='pcie-root-port'/><target chassis='1' port='0x10'/><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0' multifunction='on'/></controller>
  <controller type='pci' index='2' model='pcie-root-port'><target chassis='2' port='0x11'/><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x1'/></controller>
  <controller type='pci' index='3' model='pcie-root-port'><target chassis='3' port='0x12' hotplug='off'/><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x2'/></controller>
  <controller type='pci' index='4' model='pcie-root-port'><target chassis='4' port='0x13'/><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x3'/></controller>
  <controller type='virtio-serial' index='0'><address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/></controller>
  <hostdev mode='subsystem' type='pci' managed='no'><source><address domain='0x0000' bus='0x3b' slot='0x02' function='0x1'/></source><alias name='ua-sriov-physnet-a'/><address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></hostdev>
  <hostdev mode='subsystem' type='pci' managed='no'><source><address domain='0x0000' bus='0x3b' slot='0x02' function='0x2'/></source><alias name='ua-other'/></hostdev>
  <memballoon model='virtio'><address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/></memballoon>
</devices></domain>`
	r, err := Analyze([]byte(dom))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Ports) != 4 {
		t.Fatalf("ports %v, want 4", r.Ports)
	}
	// Port 1: the VF; 2: virtio-serial; 3: empty but hotplug off; 4: free.
	if r.Free() != 1 {
		t.Errorf("free %d, want 1 (%s)", r.Free(), r)
	}
	if r.Hostdevs["ua-sriov-physnet-a"] != 1 || r.Hostdevs["ua-other"] != -1 {
		t.Errorf("hostdevs %v", r.Hostdevs)
	}
	if p, ok := r.Port(1); !ok || len(p.Devices) != 1 || p.Devices[0] != "hostdev/ua-sriov-physnet-a" {
		t.Errorf("port 1 %+v", p)
	}
	if p, _ := r.Port(3); p.Hotplug != "off" {
		t.Errorf("port 3 hotplug %q", p.Hotplug)
	}
	if _, err := Analyze([]byte(`<domain/>`)); err == nil {
		t.Errorf("a domain without <devices> was accepted")
	}
}
