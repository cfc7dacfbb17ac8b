package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
)

const (
	// helmNS is not manifests/' namespace: the release's namespace must
	// reach the RBAC subject and the admission policy for the driver to
	// publish at all.
	helmNS      = "vfnet"
	helmRelease = "vfnet"
)

func (e *env) chartDir() string { return filepath.Join(e.repo, "deployments", "helm", "vfnet") }

// helmValues is the tier's values file: the overlay's differences from
// the shipped install, each named (test/helm checks they match).
func (e *env) helmValues() string {
	return filepath.Join(e.repo, "test", "node", "testdata", "helm-values.yaml")
}

// helmStatus is `helm status -o json`'s revision and state.
func (e *env) helmStatus(ctx context.Context, t *testing.T) (int, string) {
	t.Helper()
	out, err := e.Helm(ctx, "status", helmRelease, "-n", helmNS, "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var st struct {
		Version int `json:"version"`
		Info    struct {
			Status string `json:"status"`
		} `json:"info"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("helm status: %v\n%s", err, out)
	}
	return st.Version, st.Info.Status
}

// testHelmInstall: the kustomize install removed (kubectl delete -k), then
// `helm install --create-namespace` of the chart with the tier's values
// into another namespace: the driver pod becomes Ready and publishes the
// node's slices.
func (e *env) testHelmInstall(t *testing.T) {
	ctx := e.ctx(t)
	begin := time.Now()
	overlay := filepath.Join(e.repo, "test", "node", "testdata", "overlay")
	// Waits until every object is gone, the namespace (and so the driver
	// pod) included: the cluster-scoped names are the chart's too.
	if out, err := e.Kubectl(ctx, nil, "delete", "-k", overlay, "--timeout=4m"); err != nil {
		t.Fatalf("kubectl delete -k %s: %v\n%s", overlay, err, out)
	}
	t.Logf("kustomize install deleted in %s", time.Since(begin).Round(100*time.Millisecond))

	begin = time.Now()
	out, err := e.Helm(ctx, "install", helmRelease, e.chartDir(), "-n", helmNS, "--create-namespace", "-f", e.helmValues())
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e.ns = helmNS
	pod := e.driverPod(ctx, t)
	t.Logf("driver pod %s Ready %s after helm install", pod.Name, time.Since(begin).Round(100*time.Millisecond))
	c := pod.Spec.Containers[0]
	if c.Image != SimDriverImage || c.ImagePullPolicy != corev1.PullNever || !slices.Contains(c.Args, "--simulate") {
		t.Errorf("driver pod runs %s (pull %s) with %q, want the tier's values: %s, Never, --simulate", c.Image, c.ImagePullPolicy, c.Args, SimDriverImage)
	}
	e.waitSlices(ctx, t)
	if rev, st := e.helmStatus(ctx, t); rev != 1 || st != "deployed" {
		t.Errorf("helm status: revision %d %s, want 1 deployed", rev, st)
	}
	ds, err := e.Kube.AppsV1().DaemonSets(helmNS).Get(ctx, "vfnet-driver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Annotations["meta.helm.sh/release-name"] != helmRelease || ds.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("DaemonSet not owned by release %s: annotations %v labels %v", helmRelease, ds.Annotations, ds.Labels)
	}
}

// testHelmUpgrade: `helm upgrade` that changes the driver's pod (log
// verbosity) while a claim is prepared: a rolling update as `kubectl
// rollout restart` makes (maxSurge), the claim survives it (the VF pod
// keeps running, the VF stays prepared, the checkpoint keeps the claim)
// and the new driver pod unprepares it.
func (e *env) testHelmUpgrade(t *testing.T) {
	ctx := e.ctx(t)
	e.vfPod(ctx, t, "vf-pod-helm")
	pod, err := e.WaitPod(ctx, "default", "vf-pod-helm", podTimeout, "Ready", PodReady)
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, e.Events(ctx, "default", "vf-pod-helm"))
	}
	v := e.claimVF(ctx, t, pod, "vf")
	e.checkPrepared(t, v, "")
	old := e.driverPod(ctx, t)

	begin := time.Now()
	out, err := e.Helm(ctx, "upgrade", helmRelease, e.chartDir(), "-n", helmNS, "-f", e.helmValues(), "--set", "driver.logVerbosity=4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitReplaced(ctx, t, old, begin, "helm upgrade")
	cur := e.driverPod(ctx, t)
	if !slices.Contains(cur.Spec.Containers[0].Args, "--v=4") {
		t.Errorf("upgraded driver pod args %q lack --v=4", cur.Spec.Containers[0].Args)
	}
	if rev, st := e.helmStatus(ctx, t); rev != 2 || st != "deployed" {
		t.Errorf("helm status: revision %d %s, want 2 deployed", rev, st)
	}

	// The claim survived: same pod, never restarted, VF still prepared.
	after, err := e.Kube.CoreV1().Pods("default").Get(ctx, "vf-pod-helm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID != pod.UID || !PodReady(after) || after.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("VF pod after the upgrade: %s", DescribePod(after))
	}
	e.checkPrepared(t, v, "")
	if cp, err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Load(); err != nil || cp.Claims[types.UID(v.claim.UID)] == nil {
		t.Errorf("checkpoint after the upgrade: %+v %v, want claim %s", cp, err, v.claim.UID)
	}

	e.deletePodUnpreparedBy(ctx, t, "vf-pod-helm", v, cur)
}

// testHelmUninstall: `helm uninstall` leaves nothing of vfnet in the
// cluster (its objects, driver pods, registration and ResourceSlices go)
// but the namespace Helm created, and on the node only the files the
// chart's NOTES.txt names for an admin to decide on.
func (e *env) testHelmUninstall(t *testing.T) {
	ctx := e.ctx(t)
	notes, err := e.Helm(ctx, "get", "notes", helmRelease, "-n", helmNS)
	if err != nil {
		t.Fatalf("%v\n%s", err, notes)
	}
	begin := time.Now()
	if out, err := e.Helm(ctx, "uninstall", helmRelease, "-n", helmNS); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	// Every object the release made, by kind and name.
	gone := map[string]func(context.Context) error{
		"DaemonSet": func(ctx context.Context) error {
			_, err := e.Kube.AppsV1().DaemonSets(helmNS).Get(ctx, "vfnet-driver", metav1.GetOptions{})
			return err
		},
		"ServiceAccount": func(ctx context.Context) error {
			_, err := e.Kube.CoreV1().ServiceAccounts(helmNS).Get(ctx, "vfnet-driver", metav1.GetOptions{})
			return err
		},
		"ConfigMap": func(ctx context.Context) error {
			_, err := e.Kube.CoreV1().ConfigMaps(helmNS).Get(ctx, "vfnet-node-config", metav1.GetOptions{})
			return err
		},
		"ClusterRole": func(ctx context.Context) error {
			_, err := e.Kube.RbacV1().ClusterRoles().Get(ctx, "vfnet-driver", metav1.GetOptions{})
			return err
		},
		"ClusterRoleBinding": func(ctx context.Context) error {
			_, err := e.Kube.RbacV1().ClusterRoleBindings().Get(ctx, "vfnet-driver", metav1.GetOptions{})
			return err
		},
		"ValidatingAdmissionPolicy": func(ctx context.Context) error {
			_, err := e.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "vfnet-driver-own-node-resourceslices", metav1.GetOptions{})
			return err
		},
		"ValidatingAdmissionPolicyBinding": func(ctx context.Context) error {
			_, err := e.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "vfnet-driver-own-node-resourceslices", metav1.GetOptions{})
			return err
		},
		// kubevirt.v19SidecarClaims (testdata/helm-values.yaml).
		"MutatingAdmissionPolicy": func(ctx context.Context) error {
			_, err := e.Kube.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, "vfnet-kubevirt-v1.9-sidecar-claims", metav1.GetOptions{})
			return err
		},
		"MutatingAdmissionPolicyBinding": func(ctx context.Context) error {
			_, err := e.Kube.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Get(ctx, "vfnet-kubevirt-v1.9-sidecar-claims", metav1.GetOptions{})
			return err
		},
		"DeviceClass vfnet-physnet-a": func(ctx context.Context) error {
			_, err := e.Kube.ResourceV1().DeviceClasses().Get(ctx, "vfnet-physnet-a", metav1.GetOptions{})
			return err
		},
		"DeviceClass vfnet-physnet-b": func(ctx context.Context) error {
			_, err := e.Kube.ResourceV1().DeviceClasses().Get(ctx, "vfnet-physnet-b", metav1.GetOptions{})
			return err
		},
	}
	var left []string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		left = left[:0]
		for what, get := range gone {
			if err := get(ctx); !apierrors.IsNotFound(err) {
				left = append(left, what)
			}
		}
		pods, err := e.driverPods(ctx)
		if err != nil {
			return false, err
		}
		for _, p := range pods {
			left = append(left, "pod "+p.Name)
		}
		sl, err := e.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
		if err != nil {
			return false, err
		}
		for _, s := range sl.Items {
			left = append(left, "ResourceSlice "+s.Name)
		}
		regs, _ := filepath.Glob(filepath.Join(registryDir, driverName+"*"))
		socks, _ := filepath.Glob(filepath.Join(pluginDir, "*.sock"))
		left = append(left, append(regs, socks...)...)
		return len(left) == 0, nil
	})
	if err != nil {
		slices.Sort(left)
		t.Fatalf("after helm uninstall, still there: %v (%v)", left, err)
	}
	t.Logf("helm uninstall: everything gone after %s (ResourceSlices included)", time.Since(begin).Round(100*time.Millisecond))
	if out, err := e.Helm(ctx, "list", "-A", "-q"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("helm list after uninstall: %q %v", out, err)
	}

	// Left for an admin, as NOTES.txt says: the namespace ...
	if _, err := e.Kube.CoreV1().Namespaces().Get(ctx, helmNS, metav1.GetOptions{}); err != nil {
		t.Errorf("namespace %s (created by --create-namespace, NOTES.txt says it stays): %v", helmNS, err)
	}
	if !strings.Contains(string(notes), "the namespace "+helmNS+", when Helm created it") {
		t.Errorf("NOTES.txt does not name the namespace %s as left:\n%s", helmNS, notes)
	}
	// ... and on the node, files NOTES.txt names: no claim is prepared, so
	// no CDI spec, and the checkpoint holds nothing.
	ents, err := os.ReadDir(pluginDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		if !strings.Contains(string(notes), ent.Name()) {
			t.Errorf("%s left in %s, which NOTES.txt does not name:\n%s", ent.Name(), pluginDir, notes)
		}
		// A directory (the claims' metadata) holds nothing without a
		// prepared claim.
		if ent.IsDir() {
			var files []string
			filepath.WalkDir(filepath.Join(pluginDir, ent.Name()), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					files = append(files, p)
				}
				return nil
			})
			if len(files) > 0 {
				t.Errorf("files left in %s without a prepared claim: %v", ent.Name(), files)
			}
		}
	}
	if cdi, _ := filepath.Glob(filepath.Join(cdiDir, driverName+"*")); len(cdi) > 0 {
		t.Errorf("CDI specs left without a prepared claim: %v", cdi)
	}
	if cp, err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Load(); err != nil || len(cp.Claims) != 0 {
		t.Errorf("checkpoint after uninstall: %+v %v, want no claim", cp, err)
	}
}
