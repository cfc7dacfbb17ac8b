package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// sidecarClaimsComponent is the optional component under test, and the
// name of its MutatingAdmissionPolicy and binding.
const (
	sidecarClaimsComponent = "kubevirt-v1.9-sidecar-claims"
	sidecarClaimsPolicy    = "vfnet-kubevirt-v1.9-sidecar-claims"
)

// Two more VMs beside manifests/examples/vm.yaml, rendered like it: two vfnet
// networks and a pod network on another binding with a sidecar ("other",
// registered in the test's KubeVirt CR); and a vfnet network beside a DRA
// network of that other binding.
const (
	twoVFNetVM = `apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm-two, namespace: default}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 1Gi, reservedOverhead: {memLock: Required}}
        devices:
          interfaces:
          - {name: net-a, binding: {name: vfnet}, macAddress: "02:00:00:00:00:0a"}
          - {name: net-b, binding: {name: vfnet}, macAddress: "02:00:00:00:00:0b"}
          - {name: default, binding: {name: other}}
      networks:
      - {name: net-a, resourceClaim: {claimName: vf-a, requestName: vf}}
      - {name: net-b, resourceClaim: {claimName: vf-b, requestName: vf}}
      - {name: default, pod: {}}
      resourceClaims:
      - {name: vf-a, resourceClaimTemplateName: vf-physnet-a-vlan100}
      - {name: vf-b, resourceClaimName: shared-vf-b}
`
	mixedVM = `apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm-mixed, namespace: default}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 1Gi, reservedOverhead: {memLock: Required}}
        devices:
          interfaces:
          - {name: net-a, binding: {name: vfnet}, macAddress: "02:00:00:00:00:0c"}
          - {name: net-o, binding: {name: other}}
      networks:
      - {name: net-a, resourceClaim: {claimName: vf, requestName: vf}}
      - {name: net-o, resourceClaim: {claimName: nic, requestName: nic}}
      resourceClaims:
      - {name: vf, resourceClaimTemplateName: vf-physnet-a-vlan100}
      - {name: nic, resourceClaimTemplateName: other-nic}
`
)

// TestKubeVirtV19SidecarClaims: the optional component's
// MutatingAdmissionPolicy on a real API server, against launcher pods that
// KubeVirt v1.9.0's TemplateService renders (test/kubevirt genlauncherpod).
// Every pod is first admitted without the policy (dry run): that is what the
// API server makes of it by itself (defaults, other admission plugins), so
// with the policy exactly the vfnet sidecar's claims may differ.
func TestKubeVirtV19SidecarClaims(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	pods := renderLauncherPods(ctx, t, env)

	// Not launcher pods: the same pod without the kubevirt.io label.
	plain := pods["one"].DeepCopy()
	delete(plain.Labels, "kubevirt.io")
	pods["unlabelled"] = plain
	pods["over-cost"] = overCostPod(t, pods["one"])

	if err := env.ApplyManifests(ctx); err != nil {
		t.Fatal(err)
	}
	base := map[string]*corev1.Pod{}
	for name, p := range pods {
		b, err := createPod(ctx, env, p, true)
		if err != nil {
			t.Fatalf("pod %s without the policy: %v", name, err)
		}
		base[name] = b
	}

	begin := time.Now()
	if err := env.ApplyManifestsWith(ctx, sidecarClaimsComponent); err != nil {
		t.Fatal(err)
	}
	// The API server loads a new policy asynchronously.
	waitSidecarClaims(ctx, t, env, pods["one"], true)
	t.Logf("policy in effect %s after apply", time.Since(begin).Round(10*time.Millisecond))

	compute := func(name string) []corev1.ResourceClaim {
		return findContainer(t, base[name], "compute").Resources.Claims
	}
	for _, tc := range []struct {
		name string
		// want is the vfnet sidecar's claims after admission; nil: the
		// pod is admitted exactly as without the policy.
		want []corev1.ResourceClaim
	}{
		// v1.9.0's pod for the example VM: the sidecar gets its claim.
		{"one", []corev1.ResourceClaim{{Name: "vf", Request: "vf"}}},
		// Two vfnet networks: both claims; the other binding's sidecar and
		// every other container stay as rendered.
		{"two", []corev1.ResourceClaim{{Name: "vf-a", Request: "vf"}, {Name: "vf-b", Request: "vf"}}},
		// The pod does not say which claims are vfnet's: the sidecar gets
		// every claim of compute, the other binding's network's too (the
		// documented superset); the other sidecar is left alone.
		{"mixed", []corev1.ResourceClaim{{Name: "vf", Request: "vf"}, {Name: "nic", Request: "nic"}}},
		// v1.10's rendering (the sidecar already has its claims): unchanged.
		{"v1.10", nil},
		{"unlabelled", nil},
		// The policy's evaluation exceeds the CEL cost limit: failurePolicy
		// Ignore admits the pod unchanged (checkFailurePolicy shows that
		// this pod does make the policy fail).
		{"over-cost", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want != nil && !apiequality.Semantic.DeepEqual(tc.want, compute(tc.name)) {
				t.Fatalf("compute's claims %v, want %v: the case's VM changed", compute(tc.name), tc.want)
			}
			got, err := createPod(ctx, env, pods[tc.name], false)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			want := base[tc.name].DeepCopy()
			if tc.want != nil {
				vfnetSidecar(t, want).Resources.Claims = tc.want
			}
			samePod(t, want, got)
		})
	}

	t.Run("FailurePolicy", func(t *testing.T) { checkFailurePolicy(ctx, t, env, pods["over-cost"]) })

	// Turned off as manifests/kubevirt/README.md says: the two objects
	// deleted, launcher pods are admitted as rendered again.
	t.Run("Off", func(t *testing.T) {
		if out, err := env.Plane.Kubectl(ctx, nil, "delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy", sidecarClaimsPolicy); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		waitSidecarClaims(ctx, t, env, pods["one"], false)
		got, err := createPod(ctx, env, pods["one"], false)
		if err != nil {
			t.Fatal(err)
		}
		samePod(t, base["one"], got)
	})
}

// renderLauncherPods renders, with test/kubevirt's genlauncherpod (KubeVirt
// v1.9.0's TemplateService and virt-api's VMI mutations), the launcher pods
// of the example VM ("one"), of twoVFNetVM ("two", and "v1.10": as v1.10
// renders it) and of mixedVM ("mixed"), under the KubeVirt CR patch with
// a second binding "other" registered.
func renderLauncherPods(ctx context.Context, t *testing.T, env *flow.Env) map[string]*corev1.Pod {
	t.Helper()
	begin := time.Now()
	bin, err := gobuild.KubeVirt(ctx, env.Repo, "./cmd/genlauncherpod")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(env.Repo, "manifests", "kubevirt", "binding-patch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cr map[string]any
	if err := yaml.Unmarshal(b, &cr); err != nil {
		t.Fatalf("manifests/kubevirt/binding-patch.yaml: %v", err)
	}
	bindings, ok, _ := unstructuredMap(cr, "spec", "configuration", "network", "binding")
	if !ok || bindings["vfnet"] == nil {
		t.Fatal("manifests/kubevirt/binding-patch.yaml registers no binding vfnet")
	}
	bindings["other"] = map[string]any{"sidecarImage": "registry.example/other-binding:v1"}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b, err = yaml.Marshal(cr)
	if err != nil {
		t.Fatal(err)
	}
	crFile := write("kubevirt.yaml", b)
	two := write("two.yaml", []byte(twoVFNetVM))
	runs := map[string][]string{
		"one":   {"-vm", filepath.Join(env.Repo, "manifests", "examples", "vm.yaml")},
		"two":   {"-vm", two},
		"v1.10": {"-vm", two, "-v110-sidecar-claims"},
		"mixed": {"-vm", write("mixed.yaml", []byte(mixedVM))},
	}
	pods := map[string]*corev1.Pod{}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, args := range runs {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, filepath.Join(bin, "genlauncherpod"),
				append([]string{"-kubevirt", crFile, "-virt-api-mutations", "-uid", "0b5e6a3c-0000-4000-8000-0000000000c1"}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			pod := &corev1.Pod{}
			if err == nil {
				err = json.Unmarshal(out, pod)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[name] = fmt.Errorf("genlauncherpod %q: %w\n%s", args, err, stderr.String())
			}
			pods[name] = pod
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for name, pod := range pods {
		if pod.Namespace == "" {
			pod.Namespace = "default"
		}
		// As rendered by v1.9.0, the binding sidecar has no claims (the
		// v1.10 rendering: its networks').
		if c := vfnetSidecar(t, pod); (len(c.Resources.Claims) == 0) != (name != "v1.10") {
			t.Fatalf("pod %s: rendered vfnet sidecar %s has claims %v", name, c.Name, c.Resources.Claims)
		}
	}
	t.Logf("launcher pods rendered by KubeVirt v1.9.0's TemplateService in %s", time.Since(begin).Round(100*time.Millisecond))
	return pods
}

// overCostPod is pod with 2000 requests of its claim in compute and 2000
// of another claim in the vfnet sidecar: a valid pod for which comparing
// the two lists costs the policy more than the API server's CEL cost limit.
func overCostPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	const n = 2000
	p := pod.DeepCopy()
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "other", ResourceClaimTemplateName: ptrTo("other")})
	claim := findContainer(t, p, "compute").Resources.Claims[0].Name
	var mine, other []corev1.ResourceClaim
	for i := range n {
		mine = append(mine, corev1.ResourceClaim{Name: claim, Request: fmt.Sprintf("r%d", i)})
		other = append(other, corev1.ResourceClaim{Name: "other", Request: fmt.Sprintf("r%d", i)})
	}
	findContainer(t, p, "compute").Resources.Claims = mine
	vfnetSidecar(t, p).Resources.Claims = other
	return p
}

func ptrTo[T any](v T) *T { return &v }

// checkFailurePolicy: pod makes the policy fail (with failurePolicy Fail
// the API server rejects it, naming the cost limit), so the "over-cost"
// case's unchanged admission is failurePolicy Ignore's doing.
func checkFailurePolicy(ctx context.Context, t *testing.T, env *flow.Env, pod *corev1.Pod) {
	policies := env.Client.AdmissionregistrationV1().MutatingAdmissionPolicies()
	p, err := policies.Get(ctx, sidecarClaimsPolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != "Ignore" {
		t.Fatalf("shipped failurePolicy %v, want Ignore", p.Spec.FailurePolicy)
	}
	setFailurePolicy := func(fp string) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"failurePolicy":%q}}`, fp)
		if _, err := policies.Patch(ctx, sidecarClaimsPolicy, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setFailurePolicy("Fail")
	defer setFailurePolicy("Ignore")
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = createPod(ctx, env, pod, true)
		return last != nil, nil
	})
	if err != nil {
		t.Fatalf("with failurePolicy Fail the pod is still admitted after 30s: the pod does not make the policy fail")
	}
	if !strings.Contains(last.Error(), "cost") {
		t.Errorf("with failurePolicy Fail: %v, want a rejection for the CEL cost limit", last)
	}
	t.Logf("with failurePolicy Fail: %v", last)
}

// waitSidecarClaims waits until a dry-run create of pod gives its vfnet
// sidecar claims (on) or none (off): the policy taking effect or going.
func waitSidecarClaims(ctx context.Context, t *testing.T, env *flow.Env, pod *corev1.Pod, on bool) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := createPod(ctx, env, pod, true)
		if last = err; err != nil {
			return false, nil
		}
		return (len(vfnetSidecar(t, p).Resources.Claims) > 0) == on, nil
	})
	if err != nil {
		t.Fatalf("policy %s in effect = %v not reached in 30s (last error: %v)", sidecarClaimsPolicy, on, last)
	}
}

// createPod creates pod (dryRun: admission only, nothing stored) and returns
// what the API server admitted.
func createPod(ctx context.Context, env *flow.Env, pod *corev1.Pod, dryRun bool) (*corev1.Pod, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return env.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod.DeepCopy(), opts)
}

// samePod fails unless got is want but for what each create names anew
// (generated name, UID, version, time, managed fields).
func samePod(t *testing.T, want, got *corev1.Pod) {
	t.Helper()
	w, g := want.DeepCopy(), got.DeepCopy()
	for _, p := range []*corev1.Pod{w, g} {
		p.Name, p.UID, p.ResourceVersion, p.CreationTimestamp, p.ManagedFields = "", "", "", metav1.Time{}, nil
	}
	if !apiequality.Semantic.DeepEqual(w, g) {
		t.Errorf("admitted pod differs (-want +got):\n%s", diff.Diff(w, g))
	}
}

func findContainer(t *testing.T, pod *corev1.Pod, name string) *corev1.Container {
	t.Helper()
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	t.Fatalf("pod %s%s has no container %s", pod.Name, pod.GenerateName, name)
	return nil
}

// vfnetSidecar is the one container that serves the binding vfnet (KubeVirt
// passes the binding's name in NETWORK_BINDING_PLUGIN_NAME).
func vfnetSidecar(t *testing.T, pod *corev1.Pod) *corev1.Container {
	t.Helper()
	var found *corev1.Container
	for i := range pod.Spec.Containers {
		for _, e := range pod.Spec.Containers[i].Env {
			if e.Name == "NETWORK_BINDING_PLUGIN_NAME" && e.Value == "vfnet" {
				if found != nil {
					t.Fatalf("pod %s%s: two vfnet sidecars %s and %s", pod.Name, pod.GenerateName, found.Name, pod.Spec.Containers[i].Name)
				}
				found = &pod.Spec.Containers[i]
			}
		}
	}
	if found == nil {
		t.Fatalf("pod %s%s has no vfnet binding sidecar", pod.Name, pod.GenerateName)
	}
	return found
}
