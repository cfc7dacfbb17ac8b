//go:build kernelguest

package guest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// TestHostEvents (case "events", issue 35): the real driver, its periodic
// resync and health check an hour away, follows the real kernel's events.
// sriov_numvfs written by hand (uevents), a PF's link set down (a link
// notification) and a VF unbound from igbvf by another tool (a uevent)
// each make it rescan at once; the first two change the published
// ResourceSlices, which the API server shows within about a second. Every
// rescan logs its cause, and none is the resync's.
func TestHostEvents(t *testing.T) {
	m := guest(t)
	kube, apiHost := m.apiClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	apiNode(t, ctx, kube)
	numa1, _ := m.lay.PF(layout.RoleNUMA1)
	mainPF, _ := m.lay.PF(layout.RoleMain)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "node-config.yaml")
	doc := fmt.Sprintf("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pciAddress: %q\n  network: net-numa1\n- pciAddress: %q\n  network: net-main\n",
		numa1.Address, mainPF.Address)
	if err := os.WriteFile(cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	before := numVFsOf(t, numa1.Address)
	if before < 2 {
		t.Fatalf("PF %s has %d VFs; the layout gives it 2", numa1.Address, before)
	}
	ns := podNetns(t, apiHost, m.lay.APIServer)
	d := m.startDriverWith(t, ctx, ns, filepath.Join(dir, "drv"), cfgPath, "--resync-interval", "1h", "--health-interval", "1h", "-v", "2")
	waitFor(t, ctx, d.exited, "the slices to hold the VFs of "+numa1.Address, func() bool {
		got, err := pfDevices(ctx, kube, numa1.Address)
		return err == nil && len(got) == before
	})

	// 1. sriov_numvfs by hand: through 0 to 1.
	sysNum := "/sys/bus/pci/devices/" + numa1.Address + "/sriov_numvfs"
	t0 := time.Now()
	for _, n := range []string{"0", "1"} {
		if err := os.WriteFile(sysNum, []byte(n), 0); err != nil {
			t.Fatalf("write %s to %s: %v", n, sysNum, err)
		}
	}
	// The second write returns once the kernel has made the VF.
	written := time.Now()
	want := vfNames(t, numa1.Address, 1)
	waitFor(t, ctx, d.exited, "the slices to hold the one VF left", func() bool {
		got, err := pfDevices(ctx, kube, numa1.Address)
		return err == nil && fmt.Sprint(got) == fmt.Sprint(want)
	})
	t.Logf("measured: sriov_numvfs 0 then 1 written (the kernel took %s) -> slices in the API server %s after the last write returned",
		written.Sub(t0).Round(time.Millisecond), time.Since(written).Round(time.Millisecond))

	// 2. The main PF's link set down.
	netdev := pfNetdev(t, mainPF.Address)
	link, err := netlink.LinkByName(netdev)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := netlink.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d.exited, "the main PF's VFs tainted link-down", func() bool {
		n, err := healthTainted(ctx, kube, mainPF.Address)
		return err == nil && n == mainPF.VFs
	})
	t.Logf("measured: PF %s link down -> its %d VFs tainted in the API server: %s", netdev, mainPF.VFs, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d.exited, "the taint lifted with the link up", func() bool {
		n, err := healthTainted(ctx, kube, mainPF.Address)
		return err == nil && n == 0
	})
	t.Logf("measured: link up (carrier back) -> taint lifted in the API server: %s", time.Since(t0).Round(time.Millisecond))

	// 3. Another tool unbinds a VF from igbvf. Nothing published changes
	// (an unbound VF stays offered), but the driver looks at once.
	vf, err := filepath.EvalSymlinks("/sys/bus/pci/devices/" + mainPF.Address + "/virtfn0")
	if err != nil {
		t.Fatal(err)
	}
	bdf := filepath.Base(vf)
	t0 = time.Now()
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(bdf), 0); err != nil {
		t.Fatalf("unbind %s from igbvf: %v", bdf, err)
	}
	unbound := regexp.MustCompile(`"Rescan" cause="host events: [^"]*uevent unbind pci ` + regexp.QuoteMeta(bdf))
	waitFor(t, ctx, d.exited, "a rescan caused by the unbind", func() bool { return unbound.MatchString(d.logs.String()) })
	t.Logf("measured: VF %s unbound -> rescan (seen in the driver's log): %s", bdf, time.Since(t0).Round(time.Millisecond))
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/bind", []byte(bdf), 0); err != nil {
		t.Fatalf("bind %s back to igbvf: %v", bdf, err)
	}

	// Back to the layout's VF count for the cases after this one.
	if err := os.WriteFile(sysNum, []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sysNum, []byte(fmt.Sprint(before)), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d.exited, "the slices to follow the restored VF count", func() bool {
		got, err := pfDevices(ctx, kube, numa1.Address)
		return err == nil && len(got) == before
	})

	var causes []string
	for _, line := range strings.Split(d.logs.String(), "\n") {
		if m := regexp.MustCompile(`"Rescan" cause="([^"]*)"`).FindStringSubmatch(line); m != nil {
			causes = append(causes, m[1])
		}
	}
	t.Logf("rescans and their causes:\n  %s", strings.Join(causes, "\n  "))
	// The kernel's events named the PF: only it was reread.
	scoped := regexp.MustCompile(`"Rescan" cause="host events: [^"]*uevent change pci ` + regexp.QuoteMeta(numa1.Address) + `[^"]*" pfs=\[("[^"]*",)*"` + regexp.QuoteMeta(numa1.Address) + `"`)
	if !scoped.MatchString(d.logs.String()) {
		t.Errorf("no rescan of PF %s alone after its sriov_numvfs change (want a line matching %s)", numa1.Address, scoped)
	}
	for _, c := range causes {
		// A timer's rescan is "resync" alone; triggered ones join their
		// causes ("PF health changed; host events: ...").
		if c == "resync" || c == "VF count change pending" {
			t.Errorf("a rescan caused by %q: with the resync an hour away, every rescan must follow an event", c)
		}
	}
}

// pfNetdev is the netdev of the PF at address.
func pfNetdev(t *testing.T, address string) string {
	t.Helper()
	ents, err := os.ReadDir("/sys/bus/pci/devices/" + address + "/net")
	if err != nil || len(ents) != 1 {
		t.Fatalf("PF %s: want one netdev under net/: %v %v", address, ents, err)
	}
	return ents[0].Name()
}

// healthTainted counts the published VFs of PF pf that carry the PF health
// taint.
func healthTainted(ctx context.Context, kube kubernetes.Interface, pf string) (int, error) {
	list, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		if s.Spec.Driver != discovery.DriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[discovery.AttrPFPCIAddress]; !ok || a.StringValue == nil || *a.StringValue != pf {
				continue
			}
			for _, tn := range d.Taints {
				if tn.Key == publish.TaintKey {
					n++
				}
			}
		}
	}
	return n, nil
}
