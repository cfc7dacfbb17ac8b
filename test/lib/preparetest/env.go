// Package preparetest builds the environment the prepare tests run in: a
// simulated host (test/lib/simhost), fake API clients holding allocated claims,
// launcher pods and VMIs, and a State wired to all of them. It also takes
// snapshots of everything prepare may change on the host, so tests can check
// that a host ends exactly as it started.
package preparetest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/maclookup"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// Node is the node (and pool) name the environment uses.
const Node = "node-a"

// Env is one simulated node.
type Env struct {
	Dir       string
	Host      *simhost.Host
	Kube      *fake.Clientset
	Dynamic   *dynamicfake.FakeDynamicClient
	PluginDir string
	CDIRoot   string
}

// NewEnv builds spec under a fresh directory. base is the parent directory
// ("" = the test's temp dir); benchmarks pass a tmpfs directory.
func NewEnv(tb testing.TB, base string, spec simhost.Spec, opts ...simhost.Option) *Env {
	tb.Helper()
	dir := base
	if dir == "" {
		dir = tb.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(base, "vf"); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	h, err := simhost.Build(filepath.Join(dir, "host"), spec, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	e := &Env{
		Dir: dir, Host: h, PluginDir: filepath.Join(dir, "plugin"), CDIRoot: filepath.Join(dir, "cdi"),
		Kube: fake.NewClientset(),
		Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{maclookup.VMIResource: "VirtualMachineInstanceList"}),
	}
	for _, d := range []string{e.PluginDir, e.CDIRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return e
}

// CheckpointPath is where the State keeps its checkpoint.
func (e *Env) CheckpointPath() string { return filepath.Join(e.PluginDir, checkpoint.FileName) }

// Options wires a State to the simulated host and the fake clients.
func (e *Env) Options(hook func(string)) prepare.Options {
	return prepare.Options{
		NodeName:       Node,
		Sysfs:          e.Host.Sysfs(),
		Writer:         e.Host.Kernel(),
		Links:          e.Host.Links(),
		DevRoot:        e.Host.DevRoot(),
		CheckpointPath: e.CheckpointPath(),
		CDIRoot:        e.CDIRoot,
		Kube:           e.Kube,
		MACs:           maclookup.Lookup{Kube: e.Kube, VMIs: maclookup.DynamicVMIGetter{Client: e.Dynamic}},
		Hook:           hook,
	}
}

// NewState starts a State (as a freshly started driver would).
func (e *Env) NewState(tb testing.TB, hook func(string)) *prepare.State {
	tb.Helper()
	s, err := prepare.New(e.Options(hook))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// AddClaim stores claim in the fake API server.
func (e *Env) AddClaim(tb testing.TB, claim *resourceapi.ResourceClaim) {
	tb.Helper()
	if _, err := e.Kube.ResourceV1().ResourceClaims(claim.Namespace).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// GetClaim reads a claim back from the fake API server.
func (e *Env) GetClaim(tb testing.TB, ns, name string) *resourceapi.ResourceClaim {
	tb.Helper()
	c, err := e.Kube.ResourceV1().ResourceClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// AddVM stores a launcher pod and its VMI whose interface "dra-net" (binding
// vfnet, MAC mac) uses the claim made from a template under pod claim name
// podClaim, request "vf". It returns the pod, to reserve the claim for.
func (e *Env) AddVM(tb testing.TB, ns, vmName, podClaim, mac string) *corev1.Pod {
	tb.Helper()
	ctx := context.Background()
	tmpl := "vf-template"
	vmi := &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vmName, UID: types.UID("vmi-" + vmName)},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "dra-net", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}, MacAddress: mac},
			}}},
			Networks: []kubevirtv1.Network{{Name: "dra-net", NetworkSource: kubevirtv1.NetworkSource{
				ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: podClaim, RequestName: "vf"}}}},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: podClaim, ResourceClaimTemplateName: &tmpl}},
		},
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := e.Dynamic.Resource(maclookup.VMIResource).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	ctrl := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-launcher-" + vmName, UID: types.UID("pod-" + vmName),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmName, UID: vmi.UID, Controller: &ctrl}}},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: podClaim, ResourceClaimTemplateName: &tmpl}}},
	}
	if _, err := e.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	return pod
}

// Claim returns an allocated claim for devices (request "vf", pool Node)
// with configs.
func Claim(ns, name string, uid types.UID, devices []string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Config: configs},
		}},
	}
	for i, d := range devices {
		req := "vf"
		if i > 0 {
			req = "vf" + strings.Repeat("x", i)
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: req, Driver: discovery.DriverName, Pool: Node, Device: d,
		})
	}
	return c
}

// ReserveFor makes pod the claim's consumer and marks it a template claim
// named podClaim in the pod.
func ReserveFor(c *resourceapi.ResourceClaim, pod *corev1.Pod, podClaim string) *resourceapi.ResourceClaim {
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: podClaim}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	return c
}

// Config is an opaque VFConfig for this driver.
func Config(source resourceapi.AllocationConfigSource, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: discovery.DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

// VFSnapshot is everything prepare may change about one VF.
type VFSnapshot struct {
	Driver   string         `json:"driver"`
	Override string         `json:"override"`
	Link     vflink.VFState `json:"link"`
	NetDevs  []string       `json:"netDevs"`
}

// Snapshot is the host as prepare sees and changes it.
type Snapshot struct {
	VFs      map[string]VFSnapshot `json:"vfs"`
	DevVFIO  []string              `json:"devVfio"`
	CDIFiles []string              `json:"cdiFiles"`
}

// String renders the snapshot for diffs in failure messages.
func (s Snapshot) String() string {
	b, _ := json.MarshalIndent(s, "", " ")
	return string(b)
}

// Snapshot reads the host state.
func (e *Env) Snapshot(tb testing.TB) Snapshot {
	tb.Helper()
	pfs, err := e.Host.Sysfs().Discover(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	s := Snapshot{VFs: map[string]VFSnapshot{}}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			ov, err := os.ReadFile(e.Host.Sysfs().Path("bus/pci/devices/" + vf.Address + "/driver_override"))
			if err != nil {
				tb.Fatal(err)
			}
			link, err := e.Host.VFState(pf.Uplink(), vf.Index)
			if err != nil {
				tb.Fatal(err)
			}
			s.VFs[vf.Address] = VFSnapshot{Driver: vf.Driver, Override: strings.TrimSpace(string(ov)), Link: link, NetDevs: vf.NetDevs}
		}
	}
	s.DevVFIO = listDir(tb, filepath.Join(e.Host.DevRoot(), "vfio"))
	s.CDIFiles = listDir(tb, e.CDIRoot)
	return s
}

func listDir(tb testing.TB, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// Reopen replaces Host with a fresh handle on the same tree, as a restarted
// driver process would see it.
func (e *Env) Reopen(tb testing.TB) {
	tb.Helper()
	root := e.Host.Root()
	e.Host.Close()
	h, err := simhost.Open(root)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	e.Host = h
}

// FastDir is a tmpfs directory when the machine has one (/dev/shm), else
// "" (the test's temp dir): fsync on tmpfs is free, so benchmarks measure
// the driver and long tests stay quick.
func FastDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}

// UseSimpleClient replaces the field-managing fake clientset (which builds
// a REST mapper on every write and dominates a benchmark) with the plain
// object tracker. Call it before adding objects.
func (e *Env) UseSimpleClient() {
	e.Kube = fake.NewSimpleClientset() //nolint:staticcheck // the cheap tracker is the point here
}

// Reboot reboots the simulated node: the kernel starts fresh
// (simhost.Host.Reboot) and the CDI directory, a tmpfs (/var/run/cdi), is
// empty; the plugin directory on disk (checkpoint, metadata) survives.
func (e *Env) Reboot(tb testing.TB) {
	tb.Helper()
	if err := e.Host.Reboot(); err != nil {
		tb.Fatal(err)
	}
	if err := os.RemoveAll(e.CDIRoot); err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(e.CDIRoot, 0o755); err != nil {
		tb.Fatal(err)
	}
}
