package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// DemoHost is the simulated machine of the flow: one dual-port E810 whose
// first port (enp59s0f0, cabled to physnet-a in manifests/node-config.yaml)
// has 2 VFs and whose second port (enp59s0f1, physnet-b) has 1, so a second
// VM on physnet-b cannot fit.
func DemoHost() simhost.Spec {
	s := simhost.E810Host()
	s.PFs[0].NumVFs = 2
	s.PFs[1].NumVFs = 1
	return s
}

// GoldenDomain is a domain XML rendered by KubeVirt v1.9.0's own converter
// for a VMI with one vfnet interface (test/kubevirt generates it).
const GoldenDomain = "test/kubevirt/testdata/golden/q35-single.domain.xml"

// Result holds what a scenario measured.
type Result struct {
	// PodToPrepared is, per VM, the time from creating the launcher pod to
	// the kubelet stand-in having the claim prepared (controller, scheduler,
	// driver).
	PodToPrepared map[string]time.Duration
	// Unschedulable is the scheduler's message for the VM that cannot fit.
	Unschedulable string
	// HostdevXML is the <hostdev> vfnet-binding wrote for the first VM.
	HostdevXML string
}

// step runs one named step, printing it, and wraps its error with the name.
func (e *Env) step(name string, f func() error) error {
	start := time.Now()
	e.say("==> %s", name)
	if err := f(); err != nil {
		e.say("FAILED: %s: %v", name, err)
		return fmt.Errorf("step %q: %w", name, err)
	}
	e.say("    ok (%v)", time.Since(start).Round(time.Millisecond))
	return nil
}

// vmRun is one VM of the scenario and what was observed for it.
type vmRun struct {
	vm     *VM
	sched  *Scheduled
	ref    VFRef
	before VFHostState
}

// RunScenario is the whole end-to-end flow of issue 6 on one simulated
// node: install, publish, VMs on two networks, a VM that cannot fit, the
// driver restarted (cleanly and by a crash) mid-flow, the binding sidecar
// on the prepared metadata, and teardown back to the original host state.
// Every check failure is an error naming the step.
func (e *Env) RunScenario(ctx context.Context) (*Result, error) {
	res := &Result{PodToPrepared: map[string]time.Duration{}}
	var node *Node
	var refs []VFRef
	original := map[string]VFHostState{}
	vms := map[string]*vmRun{}

	if err := e.step("1. install vfnet: kubectl apply -k manifests/ (namespace, RBAC, admission policy, DaemonSet, node config, DeviceClasses)", func() error {
		return e.ApplyManifests(ctx)
	}); err != nil {
		return res, err
	}
	if err := e.step("2. start node-1 (simulated E810: 2 VFs on physnet-a, 1 on physnet-b) with vfnet-driver-sim --simulate under its ServiceAccount", func() error {
		var err error
		if node, err = e.AddNode(ctx, NodeOptions{Name: "node-1", Spec: DemoHost()}); err != nil {
			return err
		}
		if err := node.StartDriver(ctx); err != nil {
			return err
		}
		if refs, err = e.WaitSlices(ctx, node.Name, 3, 60*time.Second); err != nil {
			return fmt.Errorf("%w\n--- driver log ---\n%s", err, node.DriverLog(3000))
		}
		nets := map[string]int{}
		for _, r := range refs {
			nets[r.Network]++
			st, err := node.VFState(r)
			if err != nil {
				return err
			}
			original[r.Device] = st
			if st.Driver == "vfio-pci" {
				return fmt.Errorf("VF %s starts on vfio-pci, want its network driver", r.BDF)
			}
		}
		if nets["physnet-a"] != 2 || nets["physnet-b"] != 1 {
			return fmt.Errorf("published networks %v, want 2 VFs on physnet-a and 1 on physnet-b (manifests/node-config.yaml)", nets)
		}
		table, err := e.SliceTable(ctx, node.Name)
		if err != nil {
			return err
		}
		e.say("%s", indent(strings.TrimRight(table, "\n")))
		return nil
	}); err != nil {
		return res, err
	}
	if err := e.step("3. install KubeVirt v1.9.0 CRDs (virt-operator's generator) and create VM vm-a: binding vfnet, MAC 02:00:00:00:00:0a, VLAN 100 on physnet-a", func() error {
		if err := e.InstallKubeVirtCRDs(ctx); err != nil {
			return err
		}
		vm, err := e.CreateVM(ctx, VMSpec{Name: "vm-a", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:00:0a", VLAN: 100})
		if err != nil {
			return err
		}
		vms["vm-a"] = &vmRun{vm: vm}
		e.say("    VMI default/vm-a, ResourceClaimTemplate default/vm-a-vf, launcher pod default/%s (compute + hook-sidecar-0 carry claim %q)", vm.Pod.Name, PodClaimName)
		return nil
	}); err != nil {
		return res, err
	}
	if err := e.step("4. controller makes the claim, scheduler allocates a VF and binds the pod, kubelet prepares it", func() error {
		return e.schedulePrepare(ctx, node, vms["vm-a"], res, original)
	}); err != nil {
		return res, err
	}
	if err := e.step("5. check the simulated host: VF on vfio-pci with the VM's MAC and VLAN 100; CDI devices and metadata in the containers", func() error {
		return e.checkPrepared(ctx, node, vms["vm-a"], 100)
	}); err != nil {
		return res, err
	}
	if err := e.step("6. run vfnet-binding (hook sidecar) on the metadata with the VMI and a KubeVirt-generated domain", func() error {
		xml, err := e.checkBinding(ctx, node, vms["vm-a"])
		res.HostdevXML = xml
		return err
	}); err != nil {
		return res, err
	}
	if err := e.step("7. restart vfnet-driver (SIGTERM, like a DaemonSet update) and create vm-b on physnet-b (MAC 02:00:00:00:00:0b, VLAN 200)", func() error {
		if err := node.StopDriver(false); err != nil {
			return err
		}
		if err := node.StartDriver(ctx); err != nil {
			return err
		}
		e.say("    driver re-registered with the kubelet (%d registrations)", node.Kubelet.Registrations(DriverName))
		if _, err := e.WaitSlices(ctx, node.Name, 3, 60*time.Second); err != nil {
			return err
		}
		vm, err := e.CreateVM(ctx, VMSpec{Name: "vm-b", DeviceClass: "vfnet-physnet-b", MAC: "02:00:00:00:00:0b", VLAN: 200})
		if err != nil {
			return err
		}
		vms["vm-b"] = &vmRun{vm: vm}
		if err := e.schedulePrepare(ctx, node, vms["vm-b"], res, original); err != nil {
			return err
		}
		return e.checkPrepared(ctx, node, vms["vm-b"], 200)
	}); err != nil {
		return res, err
	}
	if err := e.step("8. vm-c on physnet-b cannot fit (physnet-b's only VF is taken): it stays unschedulable", func() error {
		vm, err := e.CreateVM(ctx, VMSpec{Name: "vm-c", DeviceClass: "vfnet-physnet-b", MAC: "02:00:00:00:00:0c", VLAN: 300})
		if err != nil {
			return err
		}
		vms["vm-c"] = &vmRun{vm: vm}
		msg, err := e.WaitUnschedulable(ctx, vm, 60*time.Second)
		if err != nil {
			return err
		}
		res.Unschedulable = msg
		e.say("    scheduler: %s", msg)
		if !strings.Contains(msg, "cannot allocate all claims") && !strings.Contains(msg, "resourceclaim") && !strings.Contains(strings.ToLower(msg), "claim") {
			return fmt.Errorf("unschedulable message %q does not name the claim allocation as the reason", msg)
		}
		return nil
	}); err != nil {
		return res, err
	}
	if err := e.step("9. delete vm-a's pod: unprepare restores the VF (original driver and settings), the claim is deleted", func() error {
		return e.teardownVM(ctx, node, vms["vm-a"], original)
	}); err != nil {
		return res, err
	}
	if err := e.step("10. delete vm-b: vm-c gets the freed VF with its own MAC and VLAN; the driver crashes (SIGKILL), a new one unprepares vm-c", func() error {
		// vm-c is waiting for physnet-b's only VF, so it is prepared the
		// moment vm-b's claim is gone: vm-b's restore is checked through the
		// kubelet's order of calls here and through the final host state.
		if err := e.DeleteVM(ctx, vms["vm-b"].vm, vms["vm-b"].sched.Claim.Name, 60*time.Second); err != nil {
			return err
		}
		if err := e.schedulePrepare(ctx, node, vms["vm-c"], res, original); err != nil {
			return err
		}
		if vms["vm-c"].ref.Device != vms["vm-b"].ref.Device {
			return fmt.Errorf("vm-c got %s, want vm-b's freed %s", vms["vm-c"].ref.Device, vms["vm-b"].ref.Device)
		}
		if err := orderedEvents(node.Kubelet.Events(), "unprepared default/"+vms["vm-b"].vm.Pod.Name, "prepared default/"+vms["vm-c"].vm.Pod.Name); err != nil {
			return err
		}
		// Its pod waited for a free VF: that is no preparation latency.
		delete(res.PodToPrepared, "vm-c")
		if err := e.checkPrepared(ctx, node, vms["vm-c"], 300); err != nil {
			return err
		}
		if err := node.StopDriver(true); err != nil {
			return err
		}
		e.say("    vfnet-driver killed with SIGKILL; starting a new one")
		if err := node.StartDriver(ctx); err != nil {
			return err
		}
		if _, err := e.WaitSlices(ctx, node.Name, 3, 60*time.Second); err != nil {
			return err
		}
		return e.teardownVM(ctx, node, vms["vm-c"], original)
	}); err != nil {
		return res, err
	}
	if err := e.step("11. the host is back to where it started", func() error {
		for _, r := range refs {
			st, err := node.VFState(r)
			if err != nil {
				return err
			}
			if err := sameState(original[r.Device], st); err != nil {
				return fmt.Errorf("VF %s: %w", r.BDF, err)
			}
		}
		claims, err := e.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(claims.Items) != 0 {
			return fmt.Errorf("%d ResourceClaims left in default", len(claims.Items))
		}
		if lines := node.ForbiddenLogLines(); len(lines) > 0 {
			return fmt.Errorf("the API server refused the driver (RBAC in manifests/ too tight?):\n%s", strings.Join(lines, "\n"))
		}
		e.say("    %d VFs on their original drivers with their original settings; no claims left; the driver was never refused by RBAC", len(refs))
		return nil
	}); err != nil {
		return res, err
	}
	return res, nil
}

func (e *Env) schedulePrepare(ctx context.Context, node *Node, r *vmRun, res *Result, original map[string]VFHostState) error {
	sched, err := e.WaitScheduled(ctx, r.vm, 60*time.Second)
	if err != nil {
		return err
	}
	if sched.NodeName != node.Name {
		return fmt.Errorf("pod bound to %s, want %s", sched.NodeName, node.Name)
	}
	r.sched = sched
	if r.ref, err = e.Ref(ctx, node.Name, sched.Device.Device); err != nil {
		return err
	}
	// The driver may already be preparing: "before" is the state recorded
	// when the node started.
	r.before = original[r.ref.Device]
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := node.Kubelet.WaitPrepared(wctx, r.vm.Pod.UID)
	if err != nil {
		return fmt.Errorf("%w\n--- driver log ---\n%s", err, node.DriverLog(3000))
	}
	d := st.PreparedAt.Sub(r.vm.CreatedAt)
	res.PodToPrepared[r.vm.Spec.Name] = d
	e.say("    claim %s allocated %s (%s, PF %s VF %d) on %s; prepared %v after pod creation",
		sched.Claim.Name, shortDevice(sched.Device), r.ref.BDF, r.ref.PFName, r.ref.VFIndex, sched.NodeName, d.Round(time.Millisecond))
	return nil
}

func (e *Env) checkPrepared(ctx context.Context, node *Node, r *vmRun, vlan int) error {
	st, err := node.VFState(r.ref)
	if err != nil {
		return err
	}
	if st.Driver != "vfio-pci" {
		return fmt.Errorf("VF %s is on driver %q, want vfio-pci", r.ref.BDF, st.Driver)
	}
	if !strings.EqualFold(st.Link.MAC.String(), r.vm.Spec.MAC) {
		return fmt.Errorf("VF %s MAC is %s, want the VMI's %s", r.ref.BDF, st.Link.MAC, r.vm.Spec.MAC)
	}
	if st.Link.VLAN != vlan {
		return fmt.Errorf("VF %s VLAN is %d, want the claim's VFConfig VLAN %d", r.ref.BDF, st.Link.VLAN, vlan)
	}
	e.say("    %s: driver %s -> vfio-pci (IOMMU group %s), MAC %s -> %s, VLAN %d -> %d",
		r.ref.BDF, r.before.Driver, st.IOMMUGroup, r.before.Link.MAC, st.Link.MAC, r.before.Link.VLAN, st.Link.VLAN)
	for _, c := range []string{"compute", "hook-sidecar-0"} {
		edits, err := node.Kubelet.ContainerEditsOf(r.vm.Pod.UID, c)
		if err != nil {
			return fmt.Errorf("container %s got no CDI devices: %w", c, err)
		}
		wantNode := "/dev/vfio/" + st.IOMMUGroup
		if !containsSuffix(edits.DeviceNodes, wantNode) || !containsSuffix(edits.DeviceNodes, "/dev/vfio/vfio") {
			return fmt.Errorf("container %s device nodes %v, want %s and /dev/vfio/vfio", c, edits.DeviceNodes, wantNode)
		}
		path := metadata.TemplateClaimPath(node.ContainerMetadataRoot(r.vm.Pod.UID, c), PodClaimName, RequestName)
		dev, err := metadata.Read(path)
		if err != nil {
			return fmt.Errorf("container %s: metadata: %w", c, err)
		}
		if dev.PCIBusID != r.ref.BDF {
			return fmt.Errorf("container %s: metadata pciBusID %q, want %s", c, dev.PCIBusID, r.ref.BDF)
		}
		if c == "compute" {
			e.say("    CDI devices in %s: %s; metadata %s (pciBusID %s)", c, strings.Join(edits.CDIDevices, ", "),
				strings.TrimPrefix(path, node.Kubelet.ContainerRoot(r.vm.Pod.UID, c)), dev.PCIBusID)
		}
	}
	claim, err := e.Client.ResourceV1().ResourceClaims(r.sched.Claim.Namespace).Get(ctx, r.sched.Claim.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var nd *resourceapi.NetworkDeviceData
	for _, d := range claim.Status.Devices {
		if d.Driver == DriverName && d.Device == r.sched.Device.Device {
			nd = d.NetworkData
		}
	}
	if nd == nil || !strings.EqualFold(nd.HardwareAddress, r.vm.Spec.MAC) {
		return fmt.Errorf("claim %s status.devices networkData = %+v, want hardwareAddress %s", claim.Name, nd, r.vm.Spec.MAC)
	}
	return nil
}

func (e *Env) checkBinding(ctx context.Context, node *Node, r *vmRun) (string, error) {
	domain, err := os.ReadFile(filepath.Join(e.Repo, GoldenDomain))
	if err != nil {
		return "", fmt.Errorf("read KubeVirt-generated domain (run test/kubevirt's gengolden): %w", err)
	}
	vmi, err := e.VMIJSON(ctx, r.vm)
	if err != nil {
		return "", err
	}
	out, err := e.RunBinding(ctx, node, r.vm.Pod.UID, vmi, domain)
	if err != nil {
		return "", err
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(out.DomainXML); err != nil {
		return "", fmt.Errorf("binding returned invalid domain XML: %w", err)
	}
	var found *libvirtxml.DomainHostdev
	for i := range dom.Devices.Hostdevs {
		h := &dom.Devices.Hostdevs[i]
		if h.Alias != nil && h.Alias.Name == "ua-sriov-"+r.vm.Spec.Interface {
			if found != nil {
				return "", fmt.Errorf("two hostdevs with alias ua-sriov-%s", r.vm.Spec.Interface)
			}
			found = h
		}
	}
	if found == nil || found.SubsysPCI == nil || found.SubsysPCI.Source == nil || found.SubsysPCI.Source.Address == nil {
		return "", fmt.Errorf("no PCI hostdev with alias ua-sriov-%s in the binding's domain:\n%s", r.vm.Spec.Interface, out.DomainXML)
	}
	a := found.SubsysPCI.Source.Address
	got := pciaddr.Address{Domain: deref(a.Domain), Bus: deref(a.Bus), Slot: deref(a.Slot), Function: deref(a.Function)}.String()
	if got != r.ref.BDF {
		return "", fmt.Errorf("hostdev source address %s, want the allocated VF %s", got, r.ref.BDF)
	}
	if found.Managed != "no" {
		return "", fmt.Errorf("hostdev managed=%q, want no (the driver already bound vfio-pci)", found.Managed)
	}
	xml, _ := HostdevXML(out.DomainXML, r.vm.Spec.Interface)
	e.say("    hook %q returned the domain with:\n%s", out.HookName, indent(xml))
	return xml, nil
}

func (e *Env) teardownVM(ctx context.Context, node *Node, r *vmRun, original map[string]VFHostState) error {
	if err := e.DeleteVM(ctx, r.vm, r.sched.Claim.Name, 60*time.Second); err != nil {
		return fmt.Errorf("%w\n--- driver log ---\n%s", err, node.DriverLog(3000))
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := node.Kubelet.WaitUnprepared(wctx, r.vm.Pod.UID); err != nil {
		return err
	}
	st, err := node.VFState(r.ref)
	if err != nil {
		return err
	}
	if err := sameState(original[r.ref.Device], st); err != nil {
		return fmt.Errorf("after unprepare VF %s: %w", r.ref.BDF, err)
	}
	e.say("    %s unprepared: back on %s, MAC %s, VLAN %d; claim %s deleted", r.ref.BDF, st.Driver, st.Link.MAC, st.Link.VLAN, r.sched.Claim.Name)
	return nil
}

// orderedEvents checks that first happened before second in the kubelet's log.
func orderedEvents(events []string, first, second string) error {
	i, j := -1, -1
	for k, ev := range events {
		if ev == first && i < 0 {
			i = k
		}
		if ev == second && j < 0 {
			j = k
		}
	}
	if i < 0 || j < 0 || i > j {
		return fmt.Errorf("kubelet events %v: want %q before %q", events, first, second)
	}
	return nil
}

func sameState(want, got VFHostState) error {
	if want.Driver != got.Driver {
		return fmt.Errorf("driver %q, want original %q", got.Driver, want.Driver)
	}
	if !linkEqual(want.Link, got.Link) {
		w, _ := json.Marshal(want.Link)
		g, _ := json.Marshal(got.Link)
		return fmt.Errorf("link settings %s, want original %s", g, w)
	}
	return nil
}

func linkEqual(a, b vflink.VFState) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func containsSuffix(list []string, suffix string) bool {
	for _, s := range list {
		if strings.HasSuffix(s, suffix) {
			return true
		}
	}
	return false
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// DemoDomainXML is a minimal running domain named default_vm-a, for tests
// that need a domain to attach devices to (a fake libvirt) rather than
// KubeVirt's full rendering (GoldenDomain).
const DemoDomainXML = `<domain type="kvm">
  <name>default_vm-a</name>
  <memory unit="b">1073741824</memory>
  <os>
    <type arch="x86_64" machine="q35">hvm</type>
  </os>
  <devices>
    <controller type="pci" index="0" model="pcie-root"></controller>
    <emulator>/usr/libexec/qemu-kvm</emulator>
  </devices>
</domain>`
