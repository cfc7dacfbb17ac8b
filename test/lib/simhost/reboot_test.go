package simhost

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// After Reboot the host is exactly a freshly built one: whatever drivers,
// overrides, new_id entries, VF settings, VF counts, netdev names, /dev/vfio
// nodes and group holders the running kernel had are gone.
func TestReboot(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	fresh := build(t, E810Host())

	toVFIO(t, h, "0000:3b:02.1", DriverIAVF)
	write(t, h, "bus/pci/drivers/vfio-pci/new_id", "8086 1889\n")
	if err := h.Links().SetVLAN("enp59s0f0", 1, 42, 0, "802.1Q"); err != nil {
		t.Fatal(err)
	}
	if err := h.Links().SetMAC("enp59s0f0", 2, net.HardwareAddr{2, 0, 0, 0, 0, 9}); err != nil {
		t.Fatal(err)
	}
	if err := h.SetNumVFs("0000:3b:00.1", 1); err != nil {
		t.Fatal(err)
	}
	if err := h.SetOperState("enp59s0f1", "down"); err != nil {
		t.Fatal(err)
	}
	if err := h.RenameNetdev("enp59s0f1", "uplink1"); err != nil {
		t.Fatal(err)
	}
	group := fn(t, h, "0000:3b:02.1").IOMMUGroup
	if _, err := h.HoldVFIOGroup(group, 4242, "qemu-kvm"); err != nil {
		t.Fatal(err)
	}
	if d := diff(snapshot(t, fresh.Root()), snapshot(t, h.Root())); len(d) == 0 {
		t.Fatal("the changes above changed nothing")
	}

	if err := h.Reboot(); err != nil {
		t.Fatal(err)
	}
	if d := diff(snapshot(t, fresh.Root()), snapshot(t, h.Root())); len(d) > 0 {
		t.Fatalf("rebooted host differs from a fresh one:\n%v", d)
	}
	if got, want := listDir(t, filepath.Join(h.DevRoot(), "vfio")), listDir(t, filepath.Join(fresh.DevRoot(), "vfio")); !slices.Equal(got, want) {
		t.Fatalf("/dev/vfio after reboot: %v, want %v", got, want)
	}
	if got := listDir(t, h.ProcRoot()); len(got) != 0 {
		t.Fatalf("processes survive the reboot: %v", got)
	}
	for _, vf := range []int{1, 2} {
		st, err := h.VFState("enp59s0f0", vf)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := fresh.VFState("enp59s0f0", vf)
		if fmt.Sprint(st) != fmt.Sprint(want) {
			t.Fatalf("VF %d link after reboot %v, want %v", vf, st, want)
		}
	}
	// Another process's handle sees the rebooted host, names included.
	o, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Links().VF("enp59s0f1", 3); err != nil {
		t.Fatalf("boot name of the renamed PF after reboot: %v", err)
	}
	// And the rebooted kernel works as before.
	toVFIO(t, h, "0000:3b:02.1", DriverIAVF)
}
