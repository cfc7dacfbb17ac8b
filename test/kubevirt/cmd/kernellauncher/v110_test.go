package main

import (
	"strings"
	"testing"
)

func TestSetHotplugOff(t *testing.T) {
	in := `<domain><devices>` +
		`<controller type="pci" index="1" model="pcie-root-port"><target></target></controller>` +
		`<controller type="pci" index="2" model="pcie-root-port"><model name="pcie-root-port"/><target chassis="2" port="0x11"/><address type="pci" bus="0x00"/></controller>` +
		`<controller type="pci" index="3" model="pcie-root-port"></controller>` +
		`<controller type="pci" index="4" model="pcie-root-port"><target/></controller>` +
		`</devices></domain>`
	out, err := setHotplugOff(in, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := `<domain><devices>` +
		`<controller type="pci" index="1" model="pcie-root-port"><target hotplug="off"></target></controller>` +
		`<controller type="pci" index="2" model="pcie-root-port"><model name="pcie-root-port"/><target hotplug="off" chassis="2" port="0x11"/><address type="pci" bus="0x00"/></controller>` +
		`<controller type="pci" index="3" model="pcie-root-port"><target hotplug="off"/></controller>` +
		`<controller type="pci" index="4" model="pcie-root-port"><target/></controller>` +
		`</devices></domain>`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	if _, err := setHotplugOff(in, []int{9}); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Errorf("missing port: err %v", err)
	}
}
