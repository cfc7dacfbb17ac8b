//go:build kernelguest

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

const envNumVFsKill = "VFNET_NUMVFS_KILL_DIR"

// stopAfterZero is the real sysfs writer that, once a 0 reached
// sriov_numvfs, says so and waits to be SIGKILLed: the process dies between
// the two writes of a VF count change.
type stopAfterZero struct {
	w   sysfs.Writer
	dir string
}

func (s stopAfterZero) WriteFile(rel string, data []byte) error {
	if err := s.w.WriteFile(rel, data); err != nil {
		return err
	}
	if strings.HasSuffix(rel, "/sriov_numvfs") && string(data) == "0" {
		tmp := filepath.Join(s.dir, "stopped.tmp")
		if err := os.WriteFile(tmp, []byte(rel), 0o644); err == nil {
			_ = os.Rename(tmp, filepath.Join(s.dir, "stopped"))
		}
		for {
			time.Sleep(time.Hour)
		}
	}
	return nil
}

// TestNumVFsKillHelper is the child of the crash step: the driver's VF
// count code (vfcount, as the rescan loop drives it) on the real kernel,
// killed after its 0 write.
func TestNumVFsKillHelper(t *testing.T) {
	dir := os.Getenv(envNumVFsKill)
	if dir == "" {
		t.Skip("helper process for TestNumVFs")
	}
	m := guest(t)
	cfg, err := nodeconfig.Load(filepath.Join(dir, "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := klog.NewContext(context.Background(), klog.Background())
	r := vfcount.New(vfcount.Options{NodeName: nodeName, Sysfs: m.sysfs, Writer: stopAfterZero{w: sysfs.RootWriter{Root: "/sys"}, dir: dir},
		Exclusive: func(ctx context.Context, fn func(map[string]string) error) error { return fn(nil) }})
	// Two passes: the first publishes (here: records) the taints, the
	// second writes.
	for range 2 {
		pfs, err := m.sysfs.Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.Apply(ctx, r.Plan(ctx, cfg, pfs))
	}
	t.Fatal("the VF count change did not reach its 0 write")
}

// numVFsOf reads a PF's sriov_numvfs.
func numVFsOf(t *testing.T, pf string) int {
	t.Helper()
	v, err := os.ReadFile("/sys/bus/pci/devices/" + pf + "/sriov_numvfs")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(v)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pfDevices returns the pool's devices of PF pf in the API server (name ->
// the value of the VF count taint, "" without).
func pfDevices(ctx context.Context, kube kubernetes.Interface, pf string) (map[string]string, error) {
	list, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range list.Items {
		if s.Spec.Driver != discovery.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[discovery.AttrPFPCIAddress]; !ok || a.StringValue == nil || *a.StringValue != pf {
				continue
			}
			out[d.Name] = ""
			for _, tn := range d.Taints {
				if tn.Key == vfcount.TaintKey && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
					out[d.Name] = tn.Value
				}
			}
		}
	}
	return out, nil
}

// vfNames are the device names of pf's VFs 0..n-1 as the kernel has them now.
func vfNames(t *testing.T, pf string, n int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := range n {
		target, err := os.Readlink(fmt.Sprintf("/sys/bus/pci/devices/%s/virtfn%d", pf, i))
		if err != nil {
			t.Fatal(err)
		}
		name, err := pciaddr.DeviceName(filepath.Base(target))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = ""
	}
	return out
}

// nodeEvent finds an Event on the Node with reason whose message holds
// every fragment.
func nodeEvent(ctx context.Context, kube kubernetes.Interface, reason string, fragments ...string) (string, bool) {
	list, err := kube.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", false
	}
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != nodeName || ev.Reason != reason {
			continue
		}
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(ev.Message, f)
		}
		if ok {
			return ev.Message, true
		}
	}
	return "", false
}

// Case 11: numVFs on a real igb PF, by the real vfnet-driver against the
// harness's API server: created from 0, raised and lowered with nothing
// allocated, refused above sriov_totalvfs, blocked by a prepared (then
// allocated) claim and applied once it is gone, and a process killed
// between the 0 and the N write converging after a restart. The
// ResourceSlices follow every change; a PF without numVFs is left alone.
func TestNumVFs(t *testing.T) {
	m := guest(t)
	kube, apiHost := m.apiClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	apiNode(t, ctx, kube)
	lay, _ := m.lay.PF(layout.RoleNUMA1)
	mainPF, _ := m.lay.PF(layout.RoleMain)
	pf := lay.Address
	mainBefore := numVFsOf(t, mainPF.Address)
	total, err := os.ReadFile("/sys/bus/pci/devices/" + pf + "/sriov_totalvfs")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PF %s: sriov_totalvfs %s, sriov_numvfs %d", pf, strings.TrimSpace(string(total)), numVFsOf(t, pf))
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "node-config.yaml")
	setNumVFs := func(n int) {
		t.Helper()
		// The main PF without numVFs: vfnet must never write its sriov_numvfs.
		doc := fmt.Sprintf("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pciAddress: %q\n  network: net-numa1\n  numVFs: %d\n- pciAddress: %q\n  network: net-main\n",
			pf, n, mainPF.Address)
		tmp := cfgPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgPath); err != nil { // as a ConfigMap update swaps it
			t.Fatal(err)
		}
	}
	// reached waits until the PF has n VFs, each driven by igbvf with a
	// netdev (none with autoprobe off), and the API server's slices hold
	// exactly those, untainted.
	autoprobe := true
	reached := func(d *driverProc, n int) {
		t.Helper()
		start := time.Now()
		waitFor(t, ctx, d.exited, fmt.Sprintf("%d VFs on %s", n, pf), func() bool { return numVFsOf(t, pf) == n })
		for i := range n {
			dev, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/bus/pci/devices/%s/virtfn%d", pf, i))
			if err != nil {
				t.Fatal(err)
			}
			if !autoprobe {
				if drv, err := os.Readlink(dev + "/driver"); err == nil {
					t.Fatalf("new VF %d bound to %s with sriov_drivers_autoprobe 0; vfnet leaves it unbound", i, drv)
				}
				continue
			}
			if _, err := waitNetdev(dev, 60*time.Second); err != nil {
				t.Fatalf("new VF %d: %v", i, err)
			}
			drv, _ := os.Readlink(dev + "/driver")
			if filepath.Base(drv) != "igbvf" {
				t.Fatalf("new VF %d bound to %q, want igbvf (autoprobe)", i, drv)
			}
		}
		want := vfNames(t, pf, n)
		var got map[string]string
		waitFor(t, ctx, d.exited, fmt.Sprintf("the slices to hold the %d VFs of %s untainted", n, pf), func() bool {
			got, err = pfDevices(ctx, kube, pf)
			return err == nil && fmt.Sprint(got) == fmt.Sprint(want)
		})
		t.Logf("%s at %d VFs, slices following, %s after the config change", pf, n, time.Since(start).Round(time.Millisecond))
	}
	ns := podNetns(t, apiHost, m.lay.APIServer)
	flags := []string{"--rescan-interval", "1s", "--vf-count-retry-interval", "1s"}

	// From 0: the PF's VFs removed by hand first, then the driver starts
	// with numVFs 3.
	if err := os.WriteFile("/sys/bus/pci/devices/"+pf+"/sriov_numvfs", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	setNumVFs(3)
	d := m.startDriverWith(t, ctx, ns, filepath.Join(dir, "drv"), cfgPath, flags...)
	reached(d, 3)

	// Raised and lowered with nothing allocated (through 0 each time).
	setNumVFs(5)
	reached(d, 5)
	setNumVFs(1)
	reached(d, 1)

	// Above sriov_totalvfs: refused, nothing changes.
	tot, _ := strconv.Atoi(strings.TrimSpace(string(total)))
	setNumVFs(tot + 1)
	waitFor(t, ctx, d.exited, "the refusal Event on the Node", func() bool {
		_, ok := nodeEvent(ctx, kube, vfcount.ReasonRefused, pf, fmt.Sprintf("numVFs is %d, above the PF's sriov_totalvfs %d", tot+1, tot))
		return ok
	})
	if n := numVFsOf(t, pf); n != 1 {
		t.Fatalf("a refused count changed the PF to %d VFs", n)
	}

	// A prepared VF blocks the change to 2: its VFs stay offered, tainted;
	// the Event, the log and inspect name the claim.
	vf0 := m.pf(t, layout.RoleNUMA1).VFs[0]
	ref := apiClaim(t, ctx, kube, "numvfs-blocker", `{`+vfConfigHead+`,"vlan":11}`, vf0)
	if _, err := d.prepare(ctx, ref); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	setNumVFs(2)
	vf0Name, _ := pciaddr.DeviceName(vf0.Address)
	waitFor(t, ctx, d.exited, "the blocked Event naming the claim", func() bool {
		_, ok := nodeEvent(ctx, kube, vfcount.ReasonBlocked, pf, "prepared for claim default/numvfs-blocker")
		return ok
	})
	waitFor(t, ctx, d.exited, "the VF count taint on "+vf0Name, func() bool {
		got, err := pfDevices(ctx, kube, pf)
		return err == nil && got[vf0Name] == vfcount.TaintRecreating && len(got) == 1
	})
	if n := numVFsOf(t, pf); n != 1 {
		t.Fatalf("changed to %d VFs under a prepared claim", n)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(layout.Driver, "inspect", "--sysfs-root", "/sys", "--config", cfgPath, "--node-name", nodeName,
		"--plugin-dir", filepath.Join(dir, "drv", "plugin"))
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("inspect: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "# numVFs: PF "+pf) || !strings.Contains(stderr.String(), "prepared for claim default/numvfs-blocker") {
		t.Fatalf("inspect does not say what blocks the change:\n%s", stderr.String())
	}
	t.Logf("inspect:\n%s", stderr.String())
	// Unprepared but still allocated: still blocked. Deallocated: applied.
	if err := d.unprepare(ctx, ref); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d.exited, "the blocked Event for the allocated claim", func() bool {
		_, ok := nodeEvent(ctx, kube, vfcount.ReasonBlocked, pf, "allocated for claim default/numvfs-blocker")
		return ok
	})
	if n := numVFsOf(t, pf); n != 1 {
		t.Fatalf("changed to %d VFs under an allocated claim", n)
	}
	if err := kube.ResourceV1().ResourceClaims("default").Delete(ctx, ref.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	reached(d, 2)
	if _, ok := nodeEvent(ctx, kube, vfcount.ReasonChanged, pf, "2 VFs now"); !ok {
		waitFor(t, ctx, d.exited, "the changed Event", func() bool { _, ok := nodeEvent(ctx, kube, vfcount.ReasonChanged, pf, "2 VFs now"); return ok })
	}
	d.stop(t)

	// Killed between the writes: a process running the driver's VF count
	// code dies after writing 0; the restarted driver sees 0 and writes 4.
	setNumVFs(4)
	killDir := t.TempDir()
	data, _ := os.ReadFile(cfgPath)
	if err := os.WriteFile(filepath.Join(killDir, "node-config.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	helper := exec.Command("/proc/self/exe", "-test.run", "^TestNumVFsKillHelper$", "-test.v")
	helper.Env = append(os.Environ(), envNumVFsKill+"="+killDir)
	var out bytes.Buffer
	helper.Stdout, helper.Stderr = &out, &out
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- helper.Wait() }()
	waitFor(t, ctx, exited, "the helper to stop after its 0 write", func() bool {
		_, err := os.Stat(filepath.Join(killDir, "stopped"))
		return err == nil
	})
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := <-exited; !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die of SIGKILL: %v\n%s", err, out.String())
	}
	if n := numVFsOf(t, pf); n != 0 {
		t.Fatalf("killed after the 0 write, the PF has %d VFs", n)
	}
	d2 := m.startDriverWith(t, ctx, ns, filepath.Join(dir, "drv"), cfgPath, flags...)
	reached(d2, 4)

	// sriov_drivers_autoprobe 0: the new VFs stay without a driver and are
	// offered all the same.
	setAutoprobe := func(on bool) {
		t.Helper()
		v := "0"
		if on {
			v = "1"
		}
		if err := os.WriteFile("/sys/bus/pci/devices/"+pf+"/sriov_drivers_autoprobe", []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		autoprobe = on
	}
	t.Cleanup(func() { _ = os.WriteFile("/sys/bus/pci/devices/"+pf+"/sriov_drivers_autoprobe", []byte("1"), 0) })
	setAutoprobe(false)
	setNumVFs(3)
	reached(d2, 3)
	setAutoprobe(true)

	// Back to the machine's layout for any later case.
	setNumVFs(lay.VFs)
	reached(d2, lay.VFs)
	d2.stop(t)
	if n := numVFsOf(t, mainPF.Address); n != mainBefore {
		t.Fatalf("the PF without numVFs went from %d to %d VFs", mainBefore, n)
	}
}
