package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

const (
	driverNS     = "vfnet-system"
	driverLabel  = "app.kubernetes.io/name=vfnet-driver"
	driverName   = "sriov.vfnet.io"
	pluginDir    = "/var/lib/kubelet/plugins/" + driverName
	registryDir  = "/var/lib/kubelet/plugins_registry"
	cdiDir       = "/var/run/cdi"
	claimTmpl    = "vf-physnet-a-vlan100" // manifests/examples
	exampleVLAN  = 100
	exampleMAC   = "02:00:00:00:00:01" // manifests/examples/vm.yaml
	metadataRoot = "/var/run/kubernetes.io/dra-device-attributes"
	// Generous: two cores shared by several test tiers.
	podTimeout = 4 * time.Minute
)

type env struct {
	*Node
	art  Artifacts
	repo string
	// ns is where the driver runs: driverNS as manifests/ installs it, the
	// Helm release's namespace from HelmInstall on.
	ns string
	// guestArt and guest are the guest steps' (EnvGuest): what the parent
	// prepared, and the running guest.
	guestArt *GuestArtifacts
	guest    *guestVM
}

func (e *env) ctx(t *testing.T) context.Context { return e.ctxFor(t, 10*time.Minute) }

// ctxFor is ctx for a step that may take longer than ten minutes.
func (e *env) ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// host opens the simulated host for reading VF state.
func (e *env) host(t *testing.T) *simhost.Host {
	t.Helper()
	return hostOf(t, e.Node)
}

// hostOf opens node n's simulated host.
func hostOf(t *testing.T, n *Node) *simhost.Host {
	t.Helper()
	h, err := simhost.Open(n.Path(filepath.Join(SimRoot, "sys")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// vf is a claim's VF as the API and the simulated host see it.
type vf struct {
	claim       *resourceapi.ResourceClaim
	device      string
	bdf, pf     string
	index       int
	cdiSpecFile string
}

// driverPod is the one Ready driver pod (error if not exactly one).
func (e *env) driverPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := e.Kube.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: driverLabel})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func (e *env) driverPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.driverPods(ctx)
		if err != nil {
			return false, err
		}
		if len(pods) == 1 && PodReady(&pods[0]) {
			pod = &pods[0]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		pods, _ := e.driverPods(ctx)
		var d []string
		for i := range pods {
			d = append(d, pods[i].Name+": "+DescribePod(&pods[i])+"\n"+e.Events(ctx, e.ns, pods[i].Name))
		}
		t.Fatalf("no single Ready driver pod: %v\n%s\nkubelet:\n%s", err, strings.Join(d, "\n"), Tail(e.LogFile("kubelet"), 30))
	}
	return pod
}

func (e *env) driverLog(ctx context.Context, t *testing.T) string {
	return PodLog(e.driverPod(ctx, t), "driver")
}

// kustomizeDaemonSet renders a kustomization and returns its DaemonSet.
func (e *env) kustomizeDaemonSet(ctx context.Context, dir string) (*appsv1.DaemonSet, error) {
	out, err := e.Kubectl(ctx, nil, "kustomize", dir)
	if err != nil {
		return nil, err
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if !strings.Contains(doc, "kind: DaemonSet") {
			continue
		}
		ds := &appsv1.DaemonSet{}
		if err := yaml.UnmarshalStrict([]byte(doc), ds); err != nil {
			return nil, err
		}
		return ds, nil
	}
	return nil, fmt.Errorf("no DaemonSet in %s", dir)
}

// waitSlices waits until this node's slices of the driver list every VF
// of the simulated E810 (4 + 4).
func (e *env) waitSlices(ctx context.Context, t *testing.T) {
	t.Helper()
	e.waitSlicesOf(ctx, t, NodeName)
}

// waitSlicesOf waits for node's slices to list the 8 VFs.
func (e *env) waitSlicesOf(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	if devices, err := e.waitDevices(ctx, node, 8, 2*time.Minute); err != nil {
		t.Fatalf("slices of node %s list %v, want the 8 VFs: %v", node, devices, err)
	}
}

// waitDevices waits until node's slices of the driver list want devices,
// and returns their names.
func (e *env) waitDevices(ctx context.Context, node string, want int, timeout time.Duration) ([]string, error) {
	var devices []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		sl, err := e.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		devices = devices[:0]
		for _, s := range sl.Items {
			if s.Spec.Driver == driverName {
				for _, d := range s.Spec.Devices {
					devices = append(devices, d.Name)
				}
			}
		}
		return len(devices) == want, nil
	})
	return devices, err
}

// testInstall: kubectl apply -k of the overlay; the driver pod becomes
// Ready, registers with the kubelet and publishes this node's slices.
func (e *env) testInstall(t *testing.T) {
	ctx := e.ctx(t)
	h, err := simhost.Build(SimRoot, simhost.E810Host(), simhost.WithCharDevNodes())
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	overlay := filepath.Join(e.repo, "test", "node", "testdata", "overlay")

	// The overlay changes only what a simulated node needs.
	shipped, err := e.kustomizeDaemonSet(ctx, filepath.Join(e.repo, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	ours, err := e.kustomizeDaemonSet(ctx, overlay)
	if err != nil {
		t.Fatal(err)
	}
	checkOverlay(t, shipped, ours)

	begin := time.Now()
	if out, err := e.Kubectl(ctx, nil, "apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k %s: %v\n%s", overlay, err, out)
	}
	pod := e.driverPod(ctx, t)
	t.Logf("driver pod %s Ready %s after apply", pod.Name, time.Since(begin).Round(100*time.Millisecond))
	if len(pod.Spec.Containers[0].Env) == 0 || pod.Spec.HostPID != true {
		t.Errorf("driver pod is not the shipped one: %+v", pod.Spec)
	}

	// Registered: the kubelet dialed the registration socket and the
	// plugin socket (the registrar directory holds the driver's socket and
	// the kubelet logged the registration).
	regs, _ := filepath.Glob(filepath.Join(registryDir, driverName+"*"))
	if len(regs) == 0 {
		t.Errorf("no registration socket in %s", registryDir)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(e.LogFile("kubelet"))
		return regexp.MustCompile(`(?i)regist[a-z]* .*` + regexp.QuoteMeta(driverName)).Match(b), nil
	})
	if err != nil {
		t.Errorf("kubelet never logged registering %s:\n%s", driverName, Tail(e.LogFile("kubelet"), 40))
	}

	e.waitSlices(ctx, t)

	// Without KubeVirt's CRDs, the driver's VMI watch says so once and then
	// backs off quietly (one line, not one per retry). The watch starts
	// beside the health server, so its first check may end after the pod is
	// Ready and the slices are there, and containerd copies the output to
	// the log file on its own: wait for the line, then check it is alone.
	var log string
	var vmiLines []string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		log = e.driverLog(ctx, t)
		vmiLines = vmiLines[:0]
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "VirtualMachineInstance") && strings.Contains(l, "nextCheckIn") {
				vmiLines = append(vmiLines, l)
			}
		}
		return len(vmiLines) > 0, nil
	})
	if err != nil || len(vmiLines) != 1 {
		t.Errorf("want exactly one line about the missing VirtualMachineInstance API, got %d (%v):\n%s\nlog:\n%s", len(vmiLines), err, strings.Join(vmiLines, "\n"), log)
	}
	// Logged at start, before that line, to the same stream.
	if !strings.Contains(log, "SIMULATED HOST") {
		t.Errorf("driver log lacks the simulated-host warning:\n%s", log)
	}
}

// checkOverlay: the test overlay's DaemonSet equals the shipped one except
// for the image (vfnet-driver-sim: the shipped vfnet-driver has no
// --simulate), its pull policy, the simulated host's arguments and its
// hostPath volume.
func checkOverlay(t *testing.T, shipped, ours *appsv1.DaemonSet) {
	t.Helper()
	s, o := shipped.DeepCopy(), ours.DeepCopy()
	sc, oc := &s.Spec.Template.Spec.Containers[0], &o.Spec.Template.Spec.Containers[0]
	if oc.Image != SimDriverImage || oc.ImagePullPolicy != corev1.PullNever {
		t.Errorf("overlay image %s pull %s, want %s Never", oc.Image, oc.ImagePullPolicy, SimDriverImage)
	}
	want := append(slices.Clone(sc.Args), "--simulate", "--sysfs-root="+SimRoot+"/sys", "--dev-root="+SimRoot+"/dev")
	if !reflect.DeepEqual(oc.Args, want) {
		t.Errorf("overlay args %q, want the shipped ones and the simulated host's %q", oc.Args, want)
	}
	oc.Image, oc.ImagePullPolicy, oc.Args = sc.Image, sc.ImagePullPolicy, sc.Args
	oc.VolumeMounts = slices.DeleteFunc(oc.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "vfnet-sim" })
	o.Spec.Template.Spec.Volumes = slices.DeleteFunc(o.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "vfnet-sim" })
	if !reflect.DeepEqual(s, o) {
		a, _ := yaml.Marshal(s)
		b, _ := yaml.Marshal(o)
		t.Errorf("overlay changes more than the simulated node needs:\nshipped:\n%s\noverlay:\n%s", a, b)
	}
}

// vfPod creates a pod (the pause image) with one VF from the example
// template.
func (e *env) vfPod(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if out, err := e.Kubectl(ctx, nil, "apply", "-f", filepath.Join(e.repo, "manifests", "examples", "resourceclaimtemplate.yaml")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "vf", ResourceClaimTemplateName: ptr.To(claimTmpl)}},
			Containers: []corev1.Container{{
				Name: "c", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "vf"}}},
			}},
		},
	}
	if _, err := e.Kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimVF finds the claim of a pod (podClaim = its name in the pod) and
// the VF allocated to it.
func (e *env) claimVF(ctx context.Context, t *testing.T, pod *corev1.Pod, podClaim string) vf {
	t.Helper()
	return e.claimVFOn(ctx, t, e.Node, pod, podClaim)
}

// claimVFOn is claimVF for a pod on node n.
func (e *env) claimVFOn(ctx context.Context, t *testing.T, n *Node, pod *corev1.Pod, podClaim string) vf {
	t.Helper()
	var claimName string
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == podClaim && s.ResourceClaimName != nil {
			claimName = *s.ResourceClaimName
		}
	}
	if claimName == "" {
		t.Fatalf("pod %s has no claim %s: %+v", pod.Name, podClaim, pod.Status.ResourceClaimStatuses)
	}
	c, err := e.Kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s allocation %+v", claimName, c.Status.Allocation)
	}
	r := c.Status.Allocation.Devices.Results[0]
	if r.Driver != driverName || r.Pool != n.Spec.Name {
		t.Fatalf("claim %s allocated %+v, want a device of %s on node %s", claimName, r, driverName, n.Spec.Name)
	}
	sl, err := e.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Spec.Name})
	if err != nil {
		t.Fatal(err)
	}
	out := vf{claim: c, device: r.Device}
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			if d.Name != r.Device {
				continue
			}
			attr := func(k resourceapi.QualifiedName) resourceapi.DeviceAttribute { return d.Attributes[k] }
			if v := attr("resource.kubernetes.io/pciBusID").StringValue; v != nil {
				out.bdf = *v
			}
			if v := attr("vfnet.io/pfName").StringValue; v != nil {
				out.pf = *v
			}
			if v := attr("vfnet.io/vfIndex").IntValue; v != nil {
				out.index = int(*v)
			}
		}
	}
	if out.bdf == "" || out.pf == "" {
		t.Fatalf("device %s not found with pciBusID and pfName in the node's slices", r.Device)
	}
	out.cdiSpecFile = n.Path(prepare.CDIWriter{Root: cdiDir}.SpecPath(c.UID))
	return out
}

// checkPrepared: the VF is on vfio-pci with its group node and the
// template's VLAN (and mac when set), the CDI spec names the node.
func (e *env) checkPrepared(t *testing.T, v vf, mac string) DevNode {
	t.Helper()
	return checkPreparedOn(t, e.Node, v, mac)
}

// checkPreparedOn is checkPrepared on node n.
func checkPreparedOn(t *testing.T, n *Node, v vf, mac string) DevNode {
	t.Helper()
	h := hostOf(t, n)
	fn, err := h.Sysfs().Function(v.bdf)
	if err != nil {
		t.Fatal(err)
	}
	if fn.Driver != "vfio-pci" {
		t.Errorf("VF %s on %q, want vfio-pci", v.bdf, fn.Driver)
	}
	node := filepath.Join(SimRoot, "dev", "vfio", fn.IOMMUGroup)
	dn, err := StatDev(n.Path(node))
	if err != nil || !dn.Char || dn.Major != simhost.VFIOGroupMajor {
		t.Errorf("group node %s: %+v %v, want a character device %d:N", node, dn, err, simhost.VFIOGroupMajor)
	}
	link, err := h.VFState(v.pf, v.index)
	if err != nil {
		t.Fatal(err)
	}
	if link.VLAN != exampleVLAN || (mac != "" && link.MAC.String() != mac) {
		t.Errorf("VF %d of %s: vlan %d mac %s, want %d %s", v.index, v.pf, link.VLAN, link.MAC, exampleVLAN, mac)
	}
	spec, err := os.ReadFile(v.cdiSpecFile)
	if err != nil {
		specs, _ := filepath.Glob(filepath.Join(n.Path(cdiDir), "*"))
		t.Fatalf("CDI spec of claim %s: %v (present: %v)", v.claim.Name, err, specs)
	}
	if !strings.Contains(string(spec), node) {
		t.Errorf("CDI spec %s does not name %s:\n%s", v.cdiSpecFile, node, spec)
	}
	return dn
}

// checkRestored: the VF is back on iavf without VLAN, its CDI spec and
// its claim are gone, and the checkpoint holds no claim.
func (e *env) checkRestored(ctx context.Context, t *testing.T, v vf) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := e.Kube.ResourceV1().ResourceClaims(v.claim.Namespace).Get(ctx, v.claim.Name, metav1.GetOptions{})
		_, serr := os.Stat(v.cdiSpecFile)
		return apierrors.IsNotFound(err) && os.IsNotExist(serr), nil
	})
	if err != nil {
		t.Errorf("claim %s or its CDI spec %s not removed: %v", v.claim.Name, v.cdiSpecFile, err)
	}
	h := e.host(t)
	fn, err := h.Sysfs().Function(v.bdf)
	if err != nil {
		t.Fatal(err)
	}
	link, err := h.VFState(v.pf, v.index)
	if err != nil {
		t.Fatal(err)
	}
	if fn.Driver != "iavf" || link.VLAN != 0 {
		t.Errorf("VF %s after unprepare: driver %q vlan %d, want iavf 0", v.bdf, fn.Driver, link.VLAN)
	}
	if _, err := os.Stat(filepath.Join(SimRoot, "dev", "vfio", fn.IOMMUGroup)); err == nil {
		t.Errorf("group node of %s left after unprepare", v.bdf)
	}
	if cp, err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Load(); err != nil {
		t.Errorf("checkpoint: %v", err)
	} else if len(cp.Claims) != 0 {
		t.Errorf("checkpoint still holds %v", cp.Claims)
	}
}

// checkContainerSees: the container got the CDI device nodes and the
// KEP-5304 metadata file of the claim (template claim podClaim, request vf).
func (e *env) checkContainerSees(ctx context.Context, t *testing.T, pod *corev1.Pod, container, podClaim string, v vf, group DevNode) {
	t.Helper()
	pid, err := e.ContainerPID(ctx, pod, container)
	if err != nil {
		t.Fatal(err)
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	fn, err := e.host(t).Sysfs().Function(v.bdf)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]DevNode{
		"/dev/vfio/vfio":             {Char: true, Major: simhost.VFIOContainerMajor, Minor: simhost.VFIOContainerMinor},
		"/dev/vfio/" + fn.IOMMUGroup: group,
	} {
		got, err := StatDev(root + p)
		if err != nil || got != want {
			t.Errorf("container %s: %s is %+v (%v), want %+v", container, p, got, err, want)
		}
	}
	meta := filepath.Join(root, metadataRoot, "resourceclaimtemplates", podClaim, "vf", driverName+"-metadata.json")
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Errorf("container %s: metadata file: %v", container, err)
		return
	}
	if !strings.Contains(string(b), `"DeviceMetadata"`) || !strings.Contains(string(b), `"`+v.bdf+`"`) {
		t.Errorf("container %s: metadata does not name %s:\n%s", container, v.bdf, b)
	}
}

// deletePodUnpreparedBy deletes the VF pod name in default, checks that its
// VF v is restored and waits until driver, the driver pod now running,
// logs the claim's unprepare: the driver logs it before it answers the
// kubelet, but containerd copies its output to the log file on its own.
func (e *env) deletePodUnpreparedBy(ctx context.Context, t *testing.T, name string, v vf, driver *corev1.Pod) {
	t.Helper()
	e.deletePod(ctx, t, "default", name)
	e.checkRestored(ctx, t, v)
	var log string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		log = PodLog(driver, "driver")
		return strings.Contains(log, "Unprepared claim") && strings.Contains(log, v.claim.Name), nil
	})
	if err != nil {
		t.Errorf("driver pod %s did not unprepare %s: %v\n%s", driver.Name, v.claim.Name, err, log)
	}
}

func (e *env) deletePod(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	if err := e.Kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitPodGone(ctx, ns, name, podTimeout); err != nil {
		t.Fatalf("pod %s/%s not gone: %v", ns, name, err)
	}
}

// waitLog waits until the driver's log (all its restarts) has a line
// containing every string of want.
func (e *env) waitLog(ctx context.Context, t *testing.T, want ...string) string {
	t.Helper()
	var log string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		log = e.driverLog(ctx, t)
		for _, l := range strings.Split(log, "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("driver log has no line with %q:\n%s", want, log)
	}
	return log
}

// testVFPod: a plain pod with a VF: the kubelet prepares it through the
// driver, containerd applies the CDI edits; deleting the pod unprepares.
func (e *env) testVFPod(t *testing.T) {
	ctx := e.ctx(t)
	begin := time.Now()
	e.vfPod(ctx, t, "vf-pod")
	pod, err := e.WaitPod(ctx, "default", "vf-pod", podTimeout, "Ready", PodReady)
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, e.Events(ctx, "default", "vf-pod"))
	}
	t.Logf("VF pod Ready %s after create", time.Since(begin).Round(100*time.Millisecond))
	v := e.claimVF(ctx, t, pod, "vf")
	group := e.checkPrepared(t, v, "")
	e.checkContainerSees(ctx, t, pod, "c", "vf", v, group)
	e.waitLog(ctx, t, "Prepared claim", v.claim.Name, v.device+"="+v.bdf, "duration=")

	begin = time.Now()
	e.deletePod(ctx, t, "default", "vf-pod")
	e.checkRestored(ctx, t, v)
	t.Logf("VF pod deleted until unprepared: %s", time.Since(begin).Round(100*time.Millisecond))
	e.waitLog(ctx, t, "Unprepared claim", v.claim.Name, v.device+"="+v.bdf, "duration=")
}

// container is the container of pod called name, or an empty one.
func container(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return &corev1.Container{}
}

func vmiGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
}

// testLauncherPod: the example VM's launcher pod as KubeVirt v1.9.0 renders
// it, run for real: the compute container a stand-in running KubeVirt's
// hook manager, hook-sidecar-0 the vfnet-binding image as uid 107, rendered
// without the claim, which the install's KubeVirt v1.9 component
// (manifests/components/kubevirt-v1.9-sidecar-claims) gives it at admission.
func (e *env) testLauncherPod(t *testing.T) {
	ctx := e.ctx(t)
	// KubeVirt's CRDs, then the VMI virt-controller would create: the pod's
	// owner (the garbage collector deletes pods of missing owners) and
	// where the driver reads the interface MAC.
	dyn, err := dynamic.NewForConfig(e.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := flow.ApplyKubeVirtCRDs(ctx, e.Plane, dyn, e.art.GenCRDs, filepath.Join(e.Dir, "kubevirt-crds")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(e.art.VMI)
	if err != nil {
		t.Fatal(err)
	}
	vmi := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &vmi.Object); err != nil {
		t.Fatal(err)
	}
	vmi.SetUID("")
	vmi.SetResourceVersion("")
	created, err := dyn.Resource(vmiGVR()).Namespace(vmi.GetNamespace()).Create(ctx, vmi, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VMI: %v", err)
	}

	// The pod, rendered by virt-controller's TemplateService for that VMI.
	cmd := exec.CommandContext(ctx, e.art.GenLauncherPod, append([]string{"-kubevirt", e.art.KubeVirtCR,
		"-vm", filepath.Join(e.repo, "manifests", "examples", "vm.yaml"), "-uid", string(created.GetUID())}, LauncherPodArgs()...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("genlauncherpod: %v", err)
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(out, pod); err != nil {
		t.Fatal(err)
	}
	// virt-controller creates it in the VMI's namespace, named by
	// generateName.
	if pod.Namespace == "" {
		pod.Namespace = vmi.GetNamespace()
	}
	if pod.Name == "" {
		pod.Name = strings.TrimSuffix(pod.GenerateName, "-") + "-test"
	}
	// No registry here: every image the pod names is one imported into
	// containerd, and is never pulled (the only change to the pod).
	neverPull(t, pod, e.art.Images)
	// What virt-handler does for a node: label it (the pod's node
	// selector) and advertise its device plugins' resources.
	for k, v := range pod.Spec.NodeSelector {
		if out, err := e.Kubectl(ctx, nil, "label", "--overwrite", "node", NodeName, k+"="+v); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	var extended []corev1.ResourceName
	for _, c := range pod.Spec.Containers {
		for r := range c.Resources.Limits {
			if strings.Contains(string(r), "/") && !slices.Contains(extended, r) {
				extended = append(extended, r)
			}
		}
	}
	if err := e.AddExtendedResources(ctx, extended, 110); err != nil {
		t.Fatal(err)
	}
	sidecar, computeClaims := "", []corev1.ResourceClaim(nil)
	for _, c := range pod.Spec.Containers {
		if c.Name == "compute" {
			computeClaims = c.Resources.Claims
		}
		if strings.HasPrefix(c.Name, "hook-sidecar-") {
			sidecar = c.Name
			if c.Image != BindingImage || len(c.Resources.Claims) != 0 {
				t.Errorf("rendered sidecar %s: image %s claims %v, want %s without claims (KubeVirt v1.9.0)", c.Name, c.Image, c.Resources.Claims, BindingImage)
			}
		}
	}
	if sidecar == "" || len(computeClaims) == 0 {
		t.Fatalf("rendered pod has no hook sidecar or no claims in compute: %s", out)
	}
	// The policy, applied by Install, gives the sidecar compute's claims
	// once the API server has loaded it (asynchronously; dry runs until).
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		admitted, err := e.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		return err == nil && len(container(admitted, sidecar).Resources.Claims) > 0, nil
	})
	if err != nil {
		t.Fatalf("the KubeVirt v1.9 sidecar-claims policy gives %s no claims after 30s (last dry run error: %v)", sidecar, last)
	}
	begin := time.Now()
	launcher, err := e.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create launcher pod: %v", err)
	}
	if got := container(launcher, sidecar).Resources.Claims; !reflect.DeepEqual(got, computeClaims) {
		t.Fatalf("created sidecar %s has claims %v, want compute's %v", sidecar, got, computeClaims)
	}
	pod = e.waitLauncherRunning(ctx, t, pod)
	t.Logf("launcher pod running %s after create", time.Since(begin).Round(100*time.Millisecond))
	domain := e.waitDomain(ctx, t, pod, sidecar)
	t.Logf("OnDefineDomain through the sidecar %s after create", time.Since(begin).Round(100*time.Millisecond))

	podClaim := ""
	for _, rc := range pod.Spec.ResourceClaims {
		podClaim = rc.Name
	}
	v := e.claimVF(ctx, t, pod, podClaim)
	group := e.checkPrepared(t, v, exampleMAC)
	for _, c := range []string{"compute", sidecar} {
		e.checkContainerSees(ctx, t, pod, c, podClaim, v, group)
	}
	pid, err := e.ContainerPID(ctx, pod, sidecar)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Uid", "Gid"} {
		ids, err := ProcessIDs(pid, f)
		if err != nil || !reflect.DeepEqual(ids, []string{"107", "107", "107", "107"}) {
			t.Errorf("%s process %s %v (%v), want 107 everywhere", sidecar, f, ids, err)
		}
	}
	checkHostdev(t, domain, v)

	e.deletePod(ctx, t, pod.Namespace, pod.Name)
	e.checkRestored(ctx, t, v)
	if err := dyn.Resource(vmiGVR()).Namespace(vmi.GetNamespace()).Delete(ctx, vmi.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// waitLauncherRunning waits until every container of a launcher pod runs
// (restartPolicy Never: one that ended fails the wait).
func (e *env) waitLauncherRunning(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod, err := e.WaitPod(ctx, pod.Namespace, pod.Name, podTimeout, "Running with every container started (or one ended)", func(p *corev1.Pod) bool {
		running := 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Terminated != nil {
				return true // restartPolicy Never: it stays so
			}
			if cs.State.Running != nil {
				running++
			}
		}
		return p.Status.Phase == corev1.PodRunning && running == len(p.Spec.Containers)
	})
	if err == nil {
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Terminated != nil {
				err = fmt.Errorf("container %s ended:\n%s\nlog:\n%s", cs.Name, DescribePod(pod), PodLog(pod, cs.Name))
			}
		}
	}
	if err != nil {
		name := "(none)"
		if pod != nil {
			name = pod.Name
		}
		t.Fatalf("%v\nevents:\n%s", err, e.Events(ctx, "default", name))
	}
	return pod
}

// waitDomain returns the domain the launcher stand-in's hook manager got
// back from the sidecar (printed between markers in compute's log).
func (e *env) waitDomain(ctx context.Context, t *testing.T, pod *corev1.Pod, sidecar string) string {
	t.Helper()
	var domain, log string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		log = PodLog(pod, "compute")
		if i := strings.Index(log, "VFNET-STANDIN-ERROR: "); i >= 0 {
			return false, fmt.Errorf("%s", log[i:])
		}
		i, j := strings.Index(log, "VFNET-STANDIN-DOMAIN-BEGIN\n"), strings.Index(log, "VFNET-STANDIN-DOMAIN-END")
		if i >= 0 && j > i {
			domain = log[i+len("VFNET-STANDIN-DOMAIN-BEGIN\n") : j]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no domain from the hook manager: %v\ncompute log:\n%s\n%s log:\n%s", err, log, sidecar, PodLog(pod, sidecar))
	}
	return domain
}

// checkHostdev: the domain passes VF v unmanaged as the interface's
// hostdev (ua-sriov-physnet-a).
func checkHostdev(t *testing.T, domain string, v vf) {
	t.Helper()
	hd, ok := flow.HostdevXML(domain, "physnet-a")
	if !ok {
		t.Fatalf("domain from the sidecar has no hostdev ua-sriov-physnet-a:\n%s", domain)
	}
	addr, err := pciaddr.Parse(v.bdf)
	if err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf(`domain="0x%04x" bus="0x%02x" slot="0x%02x" function="0x%x"`, addr.Domain, addr.Bus, addr.Slot, addr.Function)
	if !strings.Contains(strings.ReplaceAll(hd, "'", `"`), src) || !strings.Contains(hd, `managed="no"`) && !strings.Contains(hd, `managed='no'`) {
		t.Errorf("hostdev does not pass VF %s (%s) unmanaged:\n%s", v.bdf, src, hd)
	}
}

// neverPull sets every image of the pod (containers, init containers, image
// volumes) to pull policy Never after checking it is one of images.
func neverPull(t *testing.T, pod *corev1.Pod, images map[string]string) {
	t.Helper()
	have := func(ref string) {
		if _, ok := images[ref]; !ok {
			t.Fatalf("launcher pod uses image %s, which the tier does not build", ref)
		}
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			have(cs[i].Image)
			cs[i].ImagePullPolicy = corev1.PullNever
		}
	}
	for i := range pod.Spec.Volumes {
		if iv := pod.Spec.Volumes[i].Image; iv != nil {
			have(iv.Reference)
			iv.PullPolicy = corev1.PullNever
		}
	}
}

// waitReplaced watches the driver pods after an update began until old is
// gone and a new one is Ready, and checks the two ran side by side
// (maxSurge 1).
func (e *env) waitReplaced(ctx context.Context, t *testing.T, old *corev1.Pod, begin time.Time, what string) {
	t.Helper()
	// Watch both instances side by side until the old one is gone.
	maxRunning := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.driverPods(ctx)
		if err != nil {
			return false, err
		}
		running, oldLeft, newReady := 0, false, false
		for i := range pods {
			p := &pods[i]
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
			if p.UID == old.UID {
				oldLeft = true
			} else if PodReady(p) {
				newReady = true
			}
		}
		maxRunning = max(maxRunning, running)
		return !oldLeft && newReady, nil
	})
	if err != nil {
		t.Fatalf("%s did not replace %s: %v", what, old.Name, err)
	}
	t.Logf("%s: new driver Ready and old gone after %s; at most %d driver pods running at once", what, time.Since(begin).Round(100*time.Millisecond), maxRunning)
	if maxRunning < 2 {
		t.Errorf("the two driver instances never ran side by side (maxSurge 1)")
	}
}

// testRolloutRestart: `kubectl rollout restart` while a claim is prepared:
// the new driver pod starts beside the old one (maxSurge), the old one
// goes, and the unprepare lands on the new pod; nothing leaks.
func (e *env) testRolloutRestart(t *testing.T) {
	ctx := e.ctx(t)
	e.vfPod(ctx, t, "vf-pod-rollout")
	pod, err := e.WaitPod(ctx, "default", "vf-pod-rollout", podTimeout, "Ready", PodReady)
	if err != nil {
		t.Fatal(err)
	}
	v := e.claimVF(ctx, t, pod, "vf")
	e.checkPrepared(t, v, "")
	old := e.driverPod(ctx, t)

	begin := time.Now()
	if out, err := e.Kubectl(ctx, nil, "-n", e.ns, "rollout", "restart", "daemonset/vfnet-driver"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitReplaced(ctx, t, old, begin, "rollout restart")
	cur := e.driverPod(ctx, t)

	e.deletePodUnpreparedBy(ctx, t, "vf-pod-rollout", v, cur)
	regs, _ := filepath.Glob(filepath.Join(registryDir, "*"))
	socks, _ := filepath.Glob(filepath.Join(pluginDir, "*.sock"))
	for _, s := range append(regs, socks...) {
		if !strings.Contains(s, string(cur.UID)) && strings.Contains(s, "-") && len(regs) > 1 {
			t.Errorf("socket of an old instance left: %s (registrar dir %v, plugin dir %v)", s, regs, socks)
		}
	}
}

// testKillDuringPrepare: SIGKILL of the driver container while a prepare
// waits for the VFIO group node; the kubelet restarts the container and
// retries the prepare, which converges; the pod's deletion then restores
// the VF.
func (e *env) testKillDuringPrepare(t *testing.T) {
	ctx := e.ctx(t)
	h := e.host(t)
	// Nodes take an hour to appear: the prepare is in flight until the
	// driver's VFIO wait gives up (30 s).
	if err := h.SetVFIODevDelay(time.Hour); err != nil {
		t.Fatal(err)
	}
	before := e.driverPod(ctx, t)
	restarts := before.Status.ContainerStatuses[0].RestartCount
	e.vfPod(ctx, t, "vf-pod-kill")
	var v vf
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := e.Kube.CoreV1().Pods("default").Get(ctx, "vf-pod-kill", metav1.GetOptions{})
		// The claim exists once the pod lists it, but is allocated only
		// when the scheduler binds the pod (its PreBind writes the
		// allocation first).
		if err != nil || len(p.Status.ResourceClaimStatuses) == 0 || p.Spec.NodeName == "" {
			return false, nil
		}
		v = e.claimVF(ctx, t, p, "vf")
		fn, err := h.Sysfs().Function(v.bdf)
		if err != nil || fn.Driver != "vfio-pci" {
			return false, nil
		}
		_, err = os.Stat(filepath.Join(SimRoot, "dev", "vfio", fn.IOMMUGroup))
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Fatalf("prepare never reached the VFIO wait: %v", err)
	}
	pid, err := e.ContainerPID(ctx, before, "driver")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill driver pid %d: %v", pid, err)
	}
	killed := time.Now()
	t.Logf("SIGKILL to the driver (pid %d) with the prepare of %s in flight", pid, v.claim.Name)
	if err := h.SetVFIODevDelay(0); err != nil {
		t.Fatal(err)
	}
	pod, err := e.WaitPod(ctx, "default", "vf-pod-kill", podTimeout, "Ready", PodReady)
	if err != nil {
		t.Fatalf("%v\nevents:\n%s\ndriver:\n%s", err, e.Events(ctx, "default", "vf-pod-kill"), e.driverLog(ctx, t))
	}
	t.Logf("pod Ready %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	// The kubelet posts the driver pod's status (restart count, Ready) on
	// its own schedule, not necessarily before the VF pod's: wait for the
	// restarted container there. A driver pod of another UID is final.
	var last string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.driverPods(ctx)
		if err != nil {
			return false, err
		}
		if len(pods) != 1 {
			last = fmt.Sprintf("%d driver pods", len(pods))
			return false, nil
		}
		after := &pods[0]
		last = after.Name + ": " + DescribePod(after)
		if after.UID != before.UID {
			return false, fmt.Errorf("driver pod %s replaced by %s", before.Name, after.Name)
		}
		return PodReady(after) && len(after.Status.ContainerStatuses) > 0 && after.Status.ContainerStatuses[0].RestartCount > restarts, nil
	})
	if err != nil {
		t.Errorf("driver container was not restarted in place (restarts %d before the kill): %v; last seen %s", restarts, err, last)
	}
	group := e.checkPrepared(t, v, "")
	e.checkContainerSees(ctx, t, pod, "c", "vf", v, group)
	if cp, err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Load(); err != nil || len(cp.Claims) != 1 || cp.Claims[types.UID(v.claim.UID)] == nil {
		t.Errorf("checkpoint after the retry: %+v %v, want exactly claim %s", cp, err, v.claim.UID)
	}
	e.deletePod(ctx, t, "default", "vf-pod-kill")
	e.checkRestored(ctx, t, v)
}
