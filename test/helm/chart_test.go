package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// namespace is manifests/' namespace, where the chart is installed to
// render the same objects.
const namespace = "vfnet-system"

// repo is the repository root (this package is test/helm).
func repo(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(r, "go.mod")); err != nil || !strings.Contains(string(b), "module github.com/vfnet-io/vfnet\n") {
		t.Fatalf("%s is not the vfnet repository root: %v", r, err)
	}
	return r
}

func render(t *testing.T, ns string, vals map[string]any) *Rendered {
	t.Helper()
	r, err := Render(filepath.Join(repo(t), ChartDir), "vfnet", ns, vals)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func kustomize(t *testing.T, dir string, components ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	var err error
	if len(components) == 0 {
		objs, err = Kustomize(dir)
	} else {
		objs, err = KustomizeWith(t.TempDir(), dir, components...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func valuesFile(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// sameObjects fails the test with one line per differing field unless the
// chart's objects (less Helm's labels) are kustomize's (less its
// Namespace: Helm installs into a namespace it creates or finds, see
// namespaceless). Node config files compare by content.
func sameObjects(t *testing.T, kustomized []*unstructured.Unstructured, chart *Rendered) {
	t.Helper()
	if diff := chartDiff(t, kustomized, chart); len(diff) > 0 {
		t.Errorf("the chart's objects differ from kustomize's (want: kustomize, got: chart):\n%s", strings.Join(diff, "\n"))
	}
}

// chartDiff compares as sameObjects does and returns the differences.
func chartDiff(t *testing.T, kustomized []*unstructured.Unstructured, chart *Rendered) []string {
	t.Helper()
	want := namespaceless(t, kustomized)
	got := deepCopy(chart.Objects)
	StripLabels(got, HelmLabels()...)
	for _, objs := range [][]*unstructured.Unstructured{want, got} {
		if err := ParseYAMLData(objs); err != nil {
			t.Fatal(err)
		}
	}
	diff, err := Diff(want, got)
	if err != nil {
		t.Fatal(err)
	}
	return diff
}

func deepCopy(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopy()
	}
	return out
}

// namespaceless drops the kustomize tree's Namespace object after checking
// it is the one the chart cannot carry: Helm stores the release in its
// namespace before it creates any object, so that namespace exists first
// (helm install --create-namespace, or created by the admin with the
// pod-security label the README shows).
func namespaceless(t *testing.T, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	found := false
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if o.GetName() != namespace || o.GetLabels()["pod-security.kubernetes.io/enforce"] != "privileged" {
				t.Errorf("manifests/ has Namespace %s labels %v; the README's Helm path creates %s labelled pod-security.kubernetes.io/enforce=privileged: update both", o.GetName(), o.GetLabels(), namespace)
			}
			found = true
			continue
		}
		out = append(out, o)
	}
	if !found {
		t.Errorf("manifests/ has no Namespace %s any more: the chart's comparison expects one", namespace)
	}
	return out
}

// TestChartMatchesKustomize: with its default values the chart renders
// exactly the objects of `kubectl kustomize manifests/`, field by field.
func TestChartMatchesKustomize(t *testing.T) {
	r := repo(t)
	k := kustomize(t, filepath.Join(r, "manifests"))
	c := render(t, namespace, nil)
	sameObjects(t, k, c)
	// Every object the chart makes carries Helm's labels (what
	// `kubectl get -l app.kubernetes.io/instance=vfnet` finds).
	for _, o := range c.Objects {
		decodeStrict(t, o)
		for _, l := range HelmLabels() {
			if _, ok := o.GetLabels()[l]; !ok {
				t.Errorf("%s lacks label %s", Key(o), l)
			}
		}
	}
}

// TestChartValuesMatchComponents: each optional value renders what the
// kustomize component of the same purpose adds.
func TestChartValuesMatchComponents(t *testing.T) {
	r := repo(t)
	for _, tc := range []struct {
		component string
		values    string
	}{
		{"podmonitor", "metrics: {podMonitor: {enabled: true}}"},
		{"prometheus-scrape", "metrics: {prometheusScrape: {enabled: true}}"},
		{"kubevirt-v1.9-sidecar-claims", "kubevirt: {v19SidecarClaims: {enabled: true}}"},
	} {
		t.Run(tc.component, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &vals); err != nil {
				t.Fatal(err)
			}
			k := kustomize(t, filepath.Join(r, "manifests"), filepath.Join(r, "manifests", "components", tc.component))
			sameObjects(t, k, render(t, namespace, vals))
		})
	}
}

// TestNodeTierValuesMatchOverlay: the real-node tier installs the chart
// with test/node/testdata/helm-values.yaml; those values make the same
// objects as the tier's kustomize overlay (test/node/testdata/overlay),
// whose differences from manifests/ TestRealNode/Install checks.
func TestNodeTierValuesMatchOverlay(t *testing.T) {
	r := repo(t)
	k := kustomize(t, filepath.Join(r, "test", "node", "testdata", "overlay"))
	sameObjects(t, k, render(t, namespace, valuesFile(t, filepath.Join(r, "test", "node", "testdata", "helm-values.yaml"))))
}

// TestDiffNamesObjectAndField: a changed value makes the comparison fail,
// naming the object and the field.
func TestDiffNamesObjectAndField(t *testing.T) {
	r := repo(t)
	k := kustomize(t, filepath.Join(r, "manifests"))
	c := render(t, namespace, map[string]any{
		"driver":        map[string]any{"logVerbosity": 2, "resources": map[string]any{"requests": map[string]any{"memory": "64Mi"}}},
		"deviceClasses": []any{map[string]any{"network": "physnet-a"}},
		"nodeConfig":    map[string]any{"pfs": []any{map[string]any{"pfName": "enp59s0f0", "network": "physnet-a", "numVFs": 8}}},
	})
	diff := chartDiff(t, k, c)
	wantLines := []string{
		`DaemonSet vfnet-system/vfnet-driver: spec.template.spec.containers[name=driver].args[7]: want missing, got --v=2`,
		`DaemonSet vfnet-system/vfnet-driver: spec.template.spec.containers[name=driver].resources.requests.memory: want 50Mi, got 64Mi`,
		`ConfigMap vfnet-system/vfnet-node-config: data.node-config.yaml.pfs[0].numVFs: want missing, got 8`,
		`ConfigMap vfnet-system/vfnet-node-config: data.node-config.yaml.pfs[1]: want ` + "\n    network: physnet-b\n    pfName: enp59s0f1, got missing",
		`DeviceClass vfnet-physnet-b: missing`,
	}
	for _, w := range wantLines {
		if !slices.Contains(diff, w) {
			t.Errorf("diff lacks %q; it is:\n%s", w, strings.Join(diff, "\n"))
		}
	}
	if len(diff) != len(wantLines) {
		t.Errorf("diff has %d lines, want %d:\n%s", len(diff), len(wantLines), strings.Join(diff, "\n"))
	}
}

// TestReleaseNamespace: installed elsewhere than vfnet-system, the chart
// puts every namespaced object there and names that namespace's
// ServiceAccount wherever the driver's identity counts (RBAC subject,
// admission policy); nothing names vfnet-system.
func TestReleaseNamespace(t *testing.T) {
	c := render(t, "sriov", nil)
	for _, o := range c.Objects {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "vfnet-system") {
			t.Errorf("%s names vfnet-system:\n%s", Key(o), b)
		}
		switch o.GetKind() {
		case "ServiceAccount", "ConfigMap", "DaemonSet":
			if o.GetNamespace() != "sriov" {
				t.Errorf("%s not in the release namespace sriov", Key(o))
			}
		case "ClusterRoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != "sriov" {
				t.Errorf("%s subjects %v, want the ServiceAccount in sriov", Key(o), subjects)
			}
		case "ValidatingAdmissionPolicy":
			conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
			if len(conds) != 1 || !strings.Contains(conds[0].(map[string]any)["expression"].(string), `"system:serviceaccount:sriov:vfnet-driver"`) {
				t.Errorf("%s matchConditions %v, want the driver's ServiceAccount in sriov", Key(o), conds)
			}
		}
	}
}

// decodeStrict decodes a rendered object into its Kubernetes type,
// refusing unknown fields (a misspelt field in a template).
func decodeStrict(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	typed, err := scheme.Scheme.New(o.GroupVersionKind())
	if err != nil {
		t.Fatalf("%s: %v", Key(o), err)
	}
	if err := yaml.UnmarshalStrict(mustYAML(t, o.Object), typed); err != nil {
		t.Errorf("%s does not decode strictly as %T: %v", Key(o), typed, err)
	}
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestValues: the values an admin sets beyond the defaults render valid
// objects of the Kubernetes types, carrying what was asked.
func TestValues(t *testing.T) {
	const vals = `
image:
  driver: {repository: registry.example/vfnet-driver, tag: v9, pullPolicy: Always}
  binding: {repository: registry.example/vfnet-binding, tag: v9}
nodeConfig: |
  # as a file, verbatim
  apiVersion: vfnet.io/v1alpha1
  kind: NodeConfig
  pfs:
  - {pfName: ens1f0, network: tenant, numVFs: 16, vfs: [0, "4-7"]}
deviceClasses:
- network: tenant
  name: tenant-qinq
  selectors: ['device.attributes["vfnet.io"].supportsVlan8021ad']
  config: {vlan: 100}
driver:
  logVerbosity: 0
  hostNetns: /run/netns/host
  healthPort: 9000
  nodeSelector: {sriov: "true"}
  tolerations: []
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]}]}}}
  priorityClassName: ""
  podAnnotations: {team: net}
  # Helm merges maps into the defaults: null removes a default.
  resources: {requests: {memory: 64Mi, cpu: null}, limits: null}
metrics:
  prometheusScrape: {enabled: true}
  podMonitor: {enabled: true, interval: 10s, labels: {release: prom}}
kubevirt:
  v19SidecarClaims: {enabled: true}
`
	var v map[string]any
	if err := yaml.Unmarshal([]byte(vals), &v); err != nil {
		t.Fatal(err)
	}
	c := render(t, namespace, v)
	objs, err := ByKey(c.Objects)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range c.Objects {
		if o.GetAPIVersion() == "monitoring.coreos.com/v1" {
			continue // not a type client-go knows
		}
		decodeStrict(t, o)
	}

	ds := &appsv1.DaemonSet{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs["DaemonSet vfnet-system/vfnet-driver"].Object, ds); err != nil {
		t.Fatal(err)
	}
	pod := ds.Spec.Template
	ctr := pod.Spec.Containers[0]
	if ctr.Image != "registry.example/vfnet-driver:v9" || ctr.ImagePullPolicy != "Always" {
		t.Errorf("driver image %s pull %s", ctr.Image, ctr.ImagePullPolicy)
	}
	for _, a := range []string{"--host-netns=/run/netns/host", "--health-addr=:9000", "--v=0"} {
		if !slices.Contains(ctr.Args, a) {
			t.Errorf("driver args %q lack %s", ctr.Args, a)
		}
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != 9000 {
		t.Errorf("driver ports %v, want health on 9000", ctr.Ports)
	}
	if pod.Spec.NodeSelector["sriov"] != "true" || pod.Spec.Affinity == nil || len(pod.Spec.Tolerations) != 0 || pod.Spec.PriorityClassName != "" {
		t.Errorf("placement: nodeSelector %v affinity %v tolerations %v priorityClass %q", pod.Spec.NodeSelector, pod.Spec.Affinity, pod.Spec.Tolerations, pod.Spec.PriorityClassName)
	}
	wantAnn := map[string]string{"team": "net", "prometheus.io/scrape": "true", "prometheus.io/port": "9000", "prometheus.io/path": "/metrics"}
	if !equalMaps(pod.Annotations, wantAnn) {
		t.Errorf("pod annotations %v, want %v", pod.Annotations, wantAnn)
	}
	if got := ctr.Resources.Requests.Memory().String(); got != "64Mi" || ctr.Resources.Limits != nil {
		t.Errorf("resources %v, want only a 64Mi memory request", ctr.Resources)
	}

	cm := objs["ConfigMap vfnet-system/vfnet-node-config"]
	if data, _, _ := unstructured.NestedString(cm.Object, "data", "node-config.yaml"); !strings.HasPrefix(data, "# as a file, verbatim\n") || !strings.Contains(data, "numVFs: 16") {
		t.Errorf("node config not passed through verbatim:\n%s", data)
	}

	dc := objs["DeviceClass tenant-qinq"]
	if dc == nil {
		t.Fatalf("no DeviceClass tenant-qinq in %v", sortedKeys(objs))
	}
	sels, _, _ := unstructured.NestedSlice(dc.Object, "spec", "selectors")
	if len(sels) != 2 {
		t.Fatalf("DeviceClass selectors %v, want the network's and the extra one", sels)
	}
	if e := sels[0].(map[string]any)["cel"].(map[string]any)["expression"]; e != `device.driver == "sriov.vfnet.io" && device.attributes["vfnet.io"].network == "tenant"` {
		t.Errorf("network selector %v", e)
	}
	cfg, _, _ := unstructured.NestedSlice(dc.Object, "spec", "config")
	params := cfg[0].(map[string]any)["opaque"].(map[string]any)["parameters"].(map[string]any)
	if params["apiVersion"] != "vfnet.io/v1alpha1" || params["kind"] != "VFConfig" || params["vlan"] != int64(100) && params["vlan"] != float64(100) {
		t.Errorf("class config parameters %v", params)
	}

	pm := objs["PodMonitor vfnet-system/vfnet-driver"]
	if pm == nil || pm.GetLabels()["release"] != "prom" {
		t.Fatalf("PodMonitor %v, want one labelled release=prom", pm)
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["interval"] != "10s" {
		t.Errorf("PodMonitor endpoints %v", eps)
	}
	for _, k := range []string{"MutatingAdmissionPolicy vfnet-kubevirt-v1.9-sidecar-claims", "MutatingAdmissionPolicyBinding vfnet-kubevirt-v1.9-sidecar-claims"} {
		if objs[k] == nil {
			t.Errorf("kubevirt.v19SidecarClaims.enabled renders no %s; objects: %v", k, sortedKeys(objs))
		}
	}
	if !strings.Contains(c.Notes, "kubevirt.v19SidecarClaims.enabled, on here") {
		t.Errorf("NOTES do not say the KubeVirt v1.9 policy is on:\n%s", c.Notes)
	}
	if !strings.Contains(c.Notes, `"sidecarImage":"registry.example/vfnet-binding:v9"`) {
		t.Errorf("NOTES do not register the binding image:\n%s", c.Notes)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRequiredValues: a DeviceClass without a network fails the render
// with a message naming the value.
func TestRequiredValues(t *testing.T) {
	_, err := Render(filepath.Join(repo(t), ChartDir), "vfnet", namespace, map[string]any{"deviceClasses": []any{map[string]any{"name": "x"}}})
	if err == nil || !strings.Contains(err.Error(), "deviceClasses[0].network is required") {
		t.Errorf("render without a network: %v, want deviceClasses[0].network is required", err)
	}
}

// TestNotesRegisterBinding: the KubeVirt CR patch NOTES.txt prints with the
// default values is manifests/kubevirt/binding-patch.yaml's, so an admin
// registers the same binding on either install path.
func TestNotesRegisterBinding(t *testing.T) {
	r := repo(t)
	c := render(t, namespace, nil)
	m := regexp.MustCompile(`kubectl patch kubevirt kubevirt -n kubevirt --type merge -p \\\n\s*'([^']*)'`).FindStringSubmatch(c.Notes)
	if m == nil {
		t.Fatalf("NOTES.txt has no merge patch of the KubeVirt CR:\n%s", c.Notes)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(m[1]), &got); err != nil {
		t.Fatalf("NOTES.txt's patch %s: %v", m[1], err)
	}
	want := valuesFile(t, filepath.Join(r, "manifests", "kubevirt", "binding-patch.yaml"))
	if d := diffValue("", map[string]any{"spec": want["spec"]}, got); len(d) > 0 {
		t.Errorf("NOTES.txt's patch differs from manifests/kubevirt/binding-patch.yaml's spec (want: the file):\n%s", strings.Join(d, "\n"))
	}
	if !strings.Contains(c.Notes, "kubevirt.v19SidecarClaims.enabled, off here") {
		t.Errorf("NOTES do not say the KubeVirt v1.9 policy is off:\n%s", c.Notes)
	}
	// The uninstall notes name what stays on a node for an admin.
	for _, s := range []string{"checkpoint.json", "vfnet-prepare.lock", "vfnet-migration.lock", "serialize.lock", "dra-device-metadata/", "/var/run/cdi/sriov.vfnet.io-vf_", "--create-namespace"} {
		if !strings.Contains(c.Notes, s) {
			t.Errorf("NOTES.txt does not mention %s", s)
		}
	}
}

// TestLint: `helm lint --strict` passes with the default values and with
// the real-node tier's.
func TestLint(t *testing.T) {
	r := repo(t)
	for name, vals := range map[string]map[string]any{
		"defaults":  nil,
		"node tier": valuesFile(t, filepath.Join(r, "test", "node", "testdata", "helm-values.yaml")),
	} {
		infos, err := Lint(filepath.Join(r, ChartDir), namespace, vals)
		if err != nil {
			t.Errorf("helm lint with the %s values:\n%v", name, err)
		}
		for _, i := range infos {
			t.Logf("lint (%s): %s", name, i)
		}
	}
}
