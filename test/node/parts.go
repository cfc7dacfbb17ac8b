// Package node runs the real-node tier: a real kubelet v1.37.2 with
// containerd 2.4.2 and runc, next to the real control plane
// (test/lib/controlplane), with vfnet installed from manifests/ as a cluster
// admin would (kubectl apply -k of a test overlay), later from the Helm
// chart (helm install, upgrade, uninstall), with KubeVirt v1.9.0's own
// virt-operator, virt-api and virt-controller creating the example VM's
// launcher pod in between (the KubeVirt step; its stand-ins: README.md) and
// migrating a VM to a second node and back (the LiveMigration step; that
// node's kubelet and containerd in a mount namespace nested in the first's,
// second.go), all inside one private mount + network namespace of this
// machine, so nothing on the host changes and no traffic leaves. The SR-IOV hardware under the driver is test/lib/simhost
// (--simulate, so the driver image carries vfnet-driver-sim, the build with
// the simulator); everything above it is real.
//
// TestRealNode (VFNET_REAL_NODE=1, `make test-node`) re-runs its own test
// binary in new namespaces; this package holds what that run needs: the
// parts (Parts), the images (BuildImages), the namespace and the node
// (Up/Down), and the host checks around it (Snapshot, Sweep).
//
// Facts and workarounds it relies on: docs of the project
// (shared/docs/real-node.md): cgroup v1 (failCgroupV1: false, cgroupfs, no
// QoS cgroups), kernel tunables the kubelet would rewrite (read-only
// bind mounts with its values in the private namespace), no
// CAP_SYS_RESOURCE (restrict_oom_score_adj), hard-coded paths (/run,
// /var/lib, /var/log bound from the scratch directory), no kube-proxy (the
// service IP 10.96.0.1:443 forwarded to the API server by this process).
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

// Environment variables.
const (
	// EnvGate turns the tier on ("1"); without it TestRealNode skips.
	EnvGate = "VFNET_REAL_NODE"
	// EnvNodeBin names a directory with containerd,
	// containerd-shim-runc-v2 and ctr; default: test/builds/containerd/build.sh's
	// cache directory.
	EnvNodeBin = "VFNET_NODE_BIN"
	// EnvHelmBin names a directory with the helm CLI; default:
	// test/helm/build.sh's cache directory.
	EnvHelmBin = "VFNET_HELM_BIN"
)

// scratchPrefix names the node's scratch directories (in the temp dir).
const scratchPrefix = "vfnet-node-"

// CNIDir is where Debian's containernetworking-plugins puts the plugins.
const CNIDir = "/usr/lib/cni"

// Parts are the programs the node runs, all found before anything starts.
type Parts struct {
	// K8sBin holds kubelet, kubectl and the control plane.
	K8sBin string
	// NodeBin holds containerd, containerd-shim-runc-v2 and ctr.
	NodeBin string
	// Runc is Debian's runc.
	Runc string
	// CNIBin holds the bridge, host-local and loopback plugins.
	CNIBin string
	// Helm is the Helm v4 CLI (test/helm/build.sh).
	Helm string
}

// FindParts locates every part and says, for each missing one, how to get
// it. It never builds: a cold kubelet build takes 18 CPU-minutes.
func FindParts(ctx context.Context) (Parts, error) {
	var p Parts
	var errs []error
	repo, err := controlplane.RepoRoot()
	if err != nil {
		return p, err
	}
	if p.K8sBin, err = controlplane.BinDir(ctx); err != nil {
		errs = append(errs, err)
	} else if _, err := os.Stat(filepath.Join(p.K8sBin, "kubelet")); err != nil {
		errs = append(errs, fmt.Errorf("kubelet missing in %s (an older cache?): run test/builds/kubernetes/build.sh", p.K8sBin))
	}
	if dir := os.Getenv(EnvNodeBin); dir != "" {
		p.NodeBin = dir
	} else {
		out, err := exec.CommandContext(ctx, "bash", filepath.Join(repo, "test", "builds", "containerd", "build.sh"), "--dir").Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("test/builds/containerd/build.sh --dir: %w", err))
		}
		p.NodeBin = strings.TrimSpace(string(out))
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if st, err := os.Stat(filepath.Join(p.NodeBin, b)); err != nil || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s missing in %s: run test/builds/containerd/build.sh (about 4 CPU-minutes the first time) or set %s", b, p.NodeBin, EnvNodeBin))
		}
	}
	helmDir := os.Getenv(EnvHelmBin)
	if helmDir == "" {
		out, err := exec.CommandContext(ctx, "bash", filepath.Join(repo, "test", "helm", "build.sh"), "--dir").Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("test/helm/build.sh --dir: %w", err))
		}
		helmDir = strings.TrimSpace(string(out))
	}
	p.Helm = filepath.Join(helmDir, "helm")
	if st, err := os.Stat(p.Helm); err != nil || st.Mode()&0o111 == 0 {
		errs = append(errs, fmt.Errorf("helm missing in %s: run test/helm/build.sh (make helm-bin) or set %s", helmDir, EnvHelmBin))
	}
	if p.Runc, err = exec.LookPath("runc"); err != nil {
		errs = append(errs, fmt.Errorf("runc not found: install the Debian package runc (make deps)"))
	}
	p.CNIBin = CNIDir
	for _, b := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("CNI plugin %s missing in %s: install the Debian package containernetworking-plugins (make deps)", b, CNIDir))
		}
	}
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the real-node tier needs root (private namespaces, mounts, a kubelet)"))
	}
	return p, errors.Join(errs...)
}
