// Package standby plumbs the host side of a failover standby
// (VFConfig.failover) into a virt-launcher pod: in the pod's network
// namespace a bridge, a veth pair whose other end joins the admin's node
// bridge (nodeconfig standby.bridge) in the node's network namespace, and
// the tap pkg/contract/standby.TargetDev names, owned by the launcher's
// qemu user, which libvirt opens (<target dev='vfsb…' managed='no'/>).
//
// The plumbing is behind Plumber (Netlink is the kernel's); Handler is the
// NRI plugin's logic on top of it and NRI runs it against the container
// runtime (nri.go). vfnet-driver records at prepare what each pod needs
// (checkpoint.Standby) and the Handler asks for it by pod UID at
// RunPodSandbox, which the kubelet calls after NodePrepareResources.
package standby

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	contract "github.com/vfnet-io/vfnet/pkg/contract/standby"
)

// QEMUUser is the uid and gid of KubeVirt's non-root launcher (qemu, 107),
// which must be able to open the tap without CAP_NET_ADMIN.
const QEMUUser = 107

// Attachment is one standby to plumb into a pod.
type Attachment struct {
	// PodUID is the launcher pod's UID: the host veth's name and alias
	// derive from it, so teardown finds it without the checkpoint.
	PodUID string
	// Netns is the pod's network namespace file (from NRI).
	Netns string
	// Interface is the VMI interface name: the pod-side names derive from it.
	Interface string
	// Bridge is the node bridge in the node's network namespace.
	Bridge string
}

// Names are the devices of one attachment. Every name is at most 15
// bytes and depends only on the VMI interface name (pod side) or on the
// pod UID and the interface name (node side), so a repeated call or a
// restarted driver finds what an earlier one made.
type Names struct {
	// Tap, PodBridge and PodVeth live in the pod's namespace.
	Tap, PodBridge, PodVeth string
	// HostVeth lives in the node's namespace, on the admin's bridge.
	HostVeth string
	// HostAlias is the host veth's ifalias, naming the pod and interface
	// for an admin reading `ip link` and for teardown by pod.
	HostAlias string
}

// Name prefixes. vfsb is the tap's (pkg/contract/standby); the others
// start with "vf" too so an admin can tell them vfnet's.
const (
	podBridgePrefix = "vfbr"
	podVethPrefix   = "vfpv"
	hostVethPrefix  = "vfsh"
	// AliasPrefix starts the host veth's ifalias: "vfnet-standby pod=<uid> iface=<name>".
	AliasPrefix = "vfnet-standby pod="
)

// NamesFor returns the names of a's devices.
func NamesFor(a Attachment) Names {
	tap := contract.TargetDev(a.Interface)
	h := strings.TrimPrefix(tap, contract.TargetDevPrefix)
	sum := sha256.Sum256([]byte(a.PodUID + "/" + a.Interface))
	return Names{
		Tap:       tap,
		PodBridge: podBridgePrefix + h,
		PodVeth:   podVethPrefix + h,
		HostVeth:  hostVethPrefix + hex.EncodeToString(sum[:4]),
		HostAlias: podAlias(a.PodUID) + "iface=" + a.Interface,
	}
}

// podAlias is the start of the ifalias of every host veth of a pod.
func podAlias(podUID string) string { return AliasPrefix + podUID + " " }

// podOfAlias returns the pod UID an ifalias of ours names.
func podOfAlias(alias string) (string, bool) {
	rest, ok := strings.CutPrefix(alias, AliasPrefix)
	if !ok {
		return "", false
	}
	uid, _, ok := strings.Cut(rest, " ")
	return uid, ok && uid != ""
}

// Plumber makes and removes the standby devices.
type Plumber interface {
	// Attach makes a's devices, idempotently; on error it removes what
	// this call created.
	Attach(ctx context.Context, a Attachment) error
	// Detach removes the node-side veth ends of pod podUID (the pod side
	// goes with its namespace; deleting a veth end deletes its peer).
	Detach(ctx context.Context, podUID string) error
	// Prune removes the node-side veth ends of every pod not in keep.
	Prune(ctx context.Context, keep map[string]bool) error
}
