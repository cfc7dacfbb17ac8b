// Package flow drives vfnet end to end against a real control plane
// (test/lib/controlplane): it installs the manifests a cluster admin applies,
// KubeVirt's CRDs, simulated nodes each running the real driver program
// (vfnet-driver-sim --simulate on a test/lib/simhost tree) beside a kubelet stand-in
// (test/lib/kubeletsim), and the VM-shaped objects KubeVirt would create. The
// end-to-end tests (test/e2e) and `make demo` (test/cmd/vfnet-demo) both use it.
package flow

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
	"github.com/vfnet-io/vfnet/test/lib/ownerdir"
)

// Names the manifests define (manifests/).
const (
	Namespace      = "vfnet-system"
	ServiceAccount = "vfnet-driver"
	DaemonSet      = "vfnet-driver"
	DriverName     = "sriov.vfnet.io"
)

// Env is one control plane with vfnet installed.
type Env struct {
	Plane   *controlplane.Plane
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Repo is the repository root (manifests/, cmd/).
	Repo string
	// Dir holds built binaries and per-node state; removed by Close.
	Dir string
	// Progress receives human-readable lines (the demo prints them).
	Progress io.Writer

	binOnce sync.Once
	binDir  string
	binErr  error
	nodes   []*Node
}

// NewEnv wraps a started plane. dir must be short (unix sockets of the
// simulated nodes live below it).
func NewEnv(plane *controlplane.Plane, dir string, progress io.Writer) (*Env, error) {
	repo, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	cs, err := plane.AdminClient()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(plane.AdminRESTConfig())
	if err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	return &Env{Plane: plane, Client: cs, Dynamic: dyn, Repo: repo, Dir: dir, Progress: progress}, nil
}

// Close stops every node's driver process and kubelet stand-in. A driver
// that exits non-zero on this final SIGTERM is only logged: steps that
// restart the driver check a clean stop themselves.
func (e *Env) Close() error {
	for _, n := range e.nodes {
		if err := n.Close(); err != nil {
			e.say("warning: %v", err)
		}
	}
	return nil
}

func (e *Env) say(format string, args ...any) {
	fmt.Fprintf(e.Progress, format+"\n", args...)
}

// BinDir builds vfnet-driver-sim (the driver with --simulate, which the
// shipped vfnet-driver lacks) and vfnet-binding once per Env, as the
// images' binaries are built, and returns their directory, shared by every
// test of the repository (test/lib/gobuild: a later build finds them up to
// date and skips the link).
func (e *Env) BinDir(ctx context.Context) (string, error) {
	e.binOnce.Do(func() {
		start := time.Now()
		e.binDir, e.binErr = gobuild.Shipped(ctx, e.Repo, "./test/cmd/vfnet-driver-sim", "./cmd/vfnet-binding")
		if e.binErr != nil {
			e.binErr = fmt.Errorf("build vfnet-driver-sim and vfnet-binding: %w", e.binErr)
			return
		}
		klog.FromContext(ctx).V(1).Info("Built vfnet binaries", "dir", e.binDir, "duration", time.Since(start))
	})
	return e.binDir, e.binErr
}

// ApplyManifests installs vfnet the way a cluster admin does:
// `kubectl apply -k manifests/` (namespace, RBAC, admission policy,
// DaemonSet, node-config ConfigMap, DeviceClasses).
func (e *Env) ApplyManifests(ctx context.Context) error {
	return e.ApplyManifestsWith(ctx)
}

// ApplyManifestsWith is ApplyManifests through an overlay that adds the
// named optional components of manifests/components (e.g.
// "prometheus-scrape"), as an admin's own kustomization would.
func (e *Env) ApplyManifestsWith(ctx context.Context, components ...string) error {
	dir := filepath.Join(e.Repo, "manifests")
	if len(components) > 0 {
		overlay, err := e.overlay(components)
		if err != nil {
			return err
		}
		dir = overlay
	}
	out, err := e.Plane.Kubectl(ctx, nil, "apply", "--server-side", "-k", dir)
	if err != nil {
		return fmt.Errorf("kubectl apply -k manifests/ (components %v): %w", components, err)
	}
	e.say("%s", indent(strings.TrimSpace(string(out))))
	// The ServiceAccount is namespaced and used at once; the admission policy
	// takes effect asynchronously: wait until it is type-checked and loaded.
	return e.waitPolicyActive(ctx)
}

// overlay writes a kustomization that installs manifests/ with components
// and returns its directory.
func (e *Env) overlay(components []string) (string, error) {
	dir, err := os.MkdirTemp(e.Dir, "overlay-")
	if err != nil {
		return "", err
	}
	rel := func(p string) (string, error) { return filepath.Rel(dir, filepath.Join(e.Repo, "manifests", p)) }
	base, err := rel("")
	if err != nil {
		return "", err
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + base + "\ncomponents:\n"
	for _, c := range components {
		p, err := rel(filepath.Join("components", c))
		if err != nil {
			return "", err
		}
		k += "- " + p + "\n"
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// ApplyFile applies one manifest file or directory (examples).
func (e *Env) ApplyFile(ctx context.Context, path string) ([]byte, error) {
	return e.Plane.Kubectl(ctx, nil, "apply", "--server-side", "-f", path)
}

// waitPolicyActive waits until the ValidatingAdmissionPolicy has a type-check
// status (the API server compiled it) without warnings.
func (e *Env) waitPolicyActive(ctx context.Context) error {
	const name = "vfnet-driver-own-node-resourceslices"
	var last any
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p.Status
		if p.Status.TypeChecking == nil {
			return false, nil
		}
		if len(p.Status.TypeChecking.ExpressionWarnings) > 0 {
			return false, fmt.Errorf("admission policy %s has type-check warnings: %+v", name, p.Status.TypeChecking.ExpressionWarnings)
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("admission policy %s not type-checked by the API server: %w (status %+v)", name, err, last)
	}
	return nil
}

// InstallKubeVirtCRDs generates KubeVirt v1.9.0's CRDs with virt-operator's
// own code (test/kubevirt, cmd/gencrds), applies them and waits until they
// are established.
func (e *Env) InstallKubeVirtCRDs(ctx context.Context) error {
	bin, err := gobuild.KubeVirt(ctx, e.Repo, "./cmd/gencrds")
	if err != nil {
		return fmt.Errorf("generate KubeVirt CRDs: %w", err)
	}
	return ApplyKubeVirtCRDs(ctx, e.Plane, e.Dynamic, filepath.Join(bin, "gencrds"), filepath.Join(e.Dir, "kubevirt-crds"))
}

// ApplyKubeVirtCRDs runs the built gencrds into dir, applies what it wrote
// to plane and waits until the CRDs are established.
func ApplyKubeVirtCRDs(ctx context.Context, plane *controlplane.Plane, dyn dynamic.Interface, gencrds, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, gencrds, "-o", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.Output(); err != nil {
		return fmt.Errorf("generate KubeVirt CRDs (test/kubevirt cmd/gencrds -o %s): %w\n%s", dir, err, stderr.String())
	}
	if out, err := plane.Kubectl(ctx, nil, "apply", "--server-side", "-f", dir); err != nil {
		return fmt.Errorf("apply KubeVirt CRDs: %w\n%s", err, out)
	}
	return WaitKubeVirtCRDsEstablished(ctx, dyn)
}

// WaitKubeVirtCRDsEstablished waits until the apiserver serves KubeVirt's
// VirtualMachineInstance, VirtualMachine and KubeVirt resources. Not
// `kubectl wait --for=condition=Established`: it fails at once, instead of
// waiting, on a CRD read before the apiserver's controllers first set its
// status (`.status.conditions` is still null; kubernetes/kubernetes#66439),
// which a real-node run hit right after `kubectl apply`.
func WaitKubeVirtCRDsEstablished(ctx context.Context, dyn dynamic.Interface) error {
	for _, crd := range []string{"virtualmachineinstances.kubevirt.io", "virtualmachines.kubevirt.io", "kubevirts.kubevirt.io"} {
		if err := waitCRDEstablished(ctx, dyn, crd); err != nil {
			return err
		}
	}
	return nil
}

func waitCRDEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("CRD %s was not created by the generated manifests", name)
		}
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructuredSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for CRD %s to be established: %w", name, err)
	}
	return nil
}

func unstructuredSlice(obj map[string]any, path ...string) ([]any, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}

func indent(s string) string {
	s = strings.ReplaceAll(s, "\t", "  ")
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

const workDirPrefix = "vfe-"

// WorkDir creates a short temporary directory for an Env (unix socket paths
// below it stay far under 108 bytes) and removes directories of earlier runs
// whose process died without cleaning up (a test binary killed on timeout).
func WorkDir() (string, error) {
	dir, err := ownerdir.Make(klog.Background(), workDirPrefix)
	if err != nil {
		return "", fmt.Errorf("create work dir: %w", err)
	}
	return dir, nil
}
