package vmiwatch_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
)

const ns = "default"

type ifaceOpt struct {
	name, mac, pci string
	boot           *uint
	direct         bool // resourceClaimName instead of a template
	binding        string
}

// newVMI builds a VMI the way a VM author writes one for vfnet (docs/vms.md).
func newVMI(name string, uid types.UID, node string, opts ...ifaceOpt) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid},
	}
	for _, o := range opts {
		binding := o.binding
		if binding == "" {
			binding = "vfnet"
		}
		claim := o.name + "-claim"
		vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{
			Name: o.name, Binding: &kubevirtv1.PluginBinding{Name: binding},
			MacAddress: o.mac, PciAddress: o.pci, BootOrder: o.boot,
		})
		vmi.Spec.Networks = append(vmi.Spec.Networks, kubevirtv1.Network{Name: o.name,
			NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: claim, RequestName: "vf"}}})
		rc := kubevirtv1.VirtualMachineInstanceResourceClaim{Name: claim}
		if o.direct {
			n := "shared-" + o.name
			rc.ResourceClaimName = &n
		} else {
			t := "vf-template"
			rc.ResourceClaimTemplateName = &t
		}
		vmi.Spec.ResourceClaims = append(vmi.Spec.ResourceClaims, rc)
	}
	vmi.Status.NodeName = node
	vmi.Status.Phase = kubevirtv1.Running
	// virt-controller labels a VMI with its node when the launcher is scheduled.
	vmi.Labels = map[string]string{kubevirtv1.NodeNameLabel: node}
	return vmi
}

// migratingTo labels vmi as virt-controller does once the migration target
// pod is scheduled on node.
func migratingTo(vmi *kubevirtv1.VirtualMachineInstance, node string) *kubevirtv1.VirtualMachineInstance {
	vmi.Labels[kubevirtv1.MigrationTargetNodeNameLabel] = node
	return vmi
}

// launcherPod is a virt-launcher pod with its claim statuses filled in as
// the resourceclaim controller does for template claims.
func launcherPod(name string, uid types.UID, vmi *kubevirtv1.VirtualMachineInstance, node string, claims map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid,
			Labels: map[string]string{"kubevirt.io/created-by": string(vmi.UID), "kubevirt.io": "virt-launcher"}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for podClaim, claim := range claims {
		c := claim
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: podClaim, ResourceClaimName: &c})
	}
	return p
}

// allocatedClaim is a claim allocated to one VF, optionally with a VFConfig.
func allocatedClaim(name, device, mac string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "vf", Driver: "sriov.vfnet.io", Pool: "node", Device: device},
			}},
		}},
	}
	if mac != "" {
		raw, _ := json.Marshal(map[string]string{"apiVersion": "vfnet.io/v1alpha1", "kind": "VFConfig", "mac": mac})
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "sriov.vfnet.io", Parameters: runtime.RawExtension{Raw: raw}}},
		}}
	}
	return c
}

func ts(sec int) *metav1.Time {
	t := metav1.NewTime(time.Date(2026, 11, 30, 3, 0, sec, 0, time.UTC))
	return &t
}

// Migration states as KubeVirt's virt-controller and virt-handler record them.
func migrating(src, srcPod, dst, dstPod string) *kubevirtv1.VirtualMachineInstanceMigrationState {
	return &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: "mig-1", StartTimestamp: ts(1),
		SourceNode: src, SourcePod: srcPod, TargetNode: dst, TargetPod: dstPod,
		TargetNodeAddress: "10.0.0.2", Mode: kubevirtv1.MigrationPreCopy,
	}
}

func completed(ms *kubevirtv1.VirtualMachineInstanceMigrationState) *kubevirtv1.VirtualMachineInstanceMigrationState {
	ms = ms.DeepCopy()
	ms.Completed, ms.EndTimestamp = true, ts(9)
	ms.TargetNodeDomainDetected, ms.TargetNodeDomainReadyTimestamp = true, ts(8)
	return ms
}

func failed(ms *kubevirtv1.VirtualMachineInstanceMigrationState) *kubevirtv1.VirtualMachineInstanceMigrationState {
	ms = ms.DeepCopy()
	ms.Completed, ms.Failed, ms.EndTimestamp = true, true, ts(9)
	ms.FailureReason = "Live migration failed: target domain did not start"
	return ms
}

// fakeAttacher records requests; err is returned for every call.
type fakeAttacher struct {
	mu   sync.Mutex
	reqs []attach.Request
	ch   chan attach.Request
	err  error
}

func newFakeAttacher() *fakeAttacher { return &fakeAttacher{ch: make(chan attach.Request, 16)} }

func (f *fakeAttacher) Attach(_ context.Context, req attach.Request) (attach.Result, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	err := f.err
	f.mu.Unlock()
	f.ch <- req
	if err != nil {
		return attach.Result{}, err
	}
	res := attach.Result{Attempts: 1}
	for _, h := range req.Hostdevs {
		res.Attached = append(res.Attached, attach.Alias(h.Interface))
	}
	return res, nil
}

// WaitRemoved never sees a device leave: the watcher tests without a
// Failover config never call it.
func (f *fakeAttacher) WaitRemoved(ctx context.Context, _ attach.Removal) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeAttacher) requests() []attach.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]attach.Request(nil), f.reqs...)
}

func (f *fakeAttacher) next(t *testing.T) attach.Request {
	t.Helper()
	select {
	case r := <-f.ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no attach request within 30s")
		return attach.Request{}
	}
}

// drain returns the events recorded so far.
func drain(ch chan string) []string {
	var out []string
	for {
		select {
		case e := <-ch:
			out = append(out, e)
		default:
			return out
		}
	}
}

func uptr(v uint) *uint { return &v }
