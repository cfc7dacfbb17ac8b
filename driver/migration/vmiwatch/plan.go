// Package vmiwatch is the driver's live-migration controller. On every node it
// watches KubeVirt VirtualMachineInstances that use the vfnet binding and,
// from status.migrationState, puts VFs back into running domains: the
// target pod's VF after a completed migration on the target node, the
// original VF after a failed or aborted one on the source node. It never
// acts on a VMI without a vfnet binding interface.
package vmiwatch

import (
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// Side says which launcher pod an action attaches to.
type Side string

const (
	// Target: the migration completed; attach the target pod's VFs.
	Target Side = "target"
	// Source: the migration failed or was aborted; re-attach the source
	// pod's original VFs, which the source launcher detached.
	Source Side = "source"
	// SourceDetach: the migration is under way from this node; park the
	// MAC of each failover VF as soon as the source launcher has detached
	// it (prepare.State.SetMACParked). It lasts until the migration ends.
	SourceDetach Side = "source-detach"
)

// Action is one attach this node has to do for one migration.
type Action struct {
	Side Side
	// MigrationKey identifies the migration (migrationUid, else its start).
	MigrationKey string
	// PodName is the launcher pod by name. It is empty only on the source
	// side when status.migrationState names no sourcePod: the watcher then
	// cannot find the launcher (pods are read by name) and reports that.
	PodName string
	// Domain is the libvirt domain name in that launcher.
	Domain string
	// Interfaces are the vfnet interfaces to attach.
	Interfaces []vmiview.ClaimInterface
}

// migrationView is status.migrationState with the decentralized-migration
// sourceState/targetState folded in where the flat fields are empty.
type migrationView struct {
	key                   string
	sourceNode, sourcePod string
	targetNode, targetPod string
	completed, failed     bool
	aborted               bool
	targetDomain          *string
	targetDomainNamespace *string
}

func viewOf(ms *vmiview.MigrationState) migrationView {
	v := migrationView{
		key:        ms.MigrationUID,
		sourceNode: ms.SourceNode, sourcePod: ms.SourcePod,
		targetNode: ms.TargetNode, targetPod: ms.TargetPod,
		completed: ms.Completed, failed: ms.Failed,
		aborted: ms.AbortStatus == vmiview.MigrationAbortSucceeded,
	}
	if v.key == "" && ms.StartTimestamp != nil {
		v.key = ms.StartTimestamp.UTC().Format("2006-01-02T15:04:05.000000Z")
	}
	if s := ms.SourceState; s != nil {
		v.sourceNode = or(v.sourceNode, s.Node)
		v.sourcePod = or(v.sourcePod, s.Pod)
		if v.key == "" {
			v.key = s.MigrationUID
		}
	}
	if t := ms.TargetState; t != nil {
		v.targetNode = or(v.targetNode, t.Node)
		v.targetPod = or(v.targetPod, t.Pod)
		v.targetDomain, v.targetDomainNamespace = t.DomainName, t.DomainNamespace
		if v.key == "" {
			v.key = t.MigrationUID
		}
	}
	return v
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// DomainName is KubeVirt's libvirt domain name for a VMI.
func DomainName(namespace, name string) string { return namespace + "_" + name }

// Plan returns what node has to attach for vmi now, given its vfnet
// interfaces. It is a pure function of the VMI so that replays (informer
// resyncs, driver restarts) give the same answer; the attach is idempotent.
func Plan(vmi *vmiview.VMI, ifaces []vmiview.ClaimInterface, node string) []Action {
	ms := vmi.Status.MigrationState
	if ms == nil || len(ifaces) == 0 || node == "" {
		return nil
	}
	v := viewOf(ms)
	if v.key == "" {
		return nil
	}
	var out []Action
	switch {
	case !v.completed && !v.failed && !v.aborted:
		if v.sourceNode == node && v.sourcePod != "" {
			out = append(out, Action{Side: SourceDetach, MigrationKey: v.key, PodName: v.sourcePod,
				Domain: DomainName(vmi.Metadata.Namespace, vmi.Metadata.Name), Interfaces: ifaces})
		}
	case v.failed || v.aborted:
		// The guest keeps running on the source, without the VFs its
		// launcher detached before migrating.
		if v.sourceNode == node {
			out = append(out, Action{Side: Source, MigrationKey: v.key, PodName: v.sourcePod,
				Domain: DomainName(vmi.Metadata.Namespace, vmi.Metadata.Name), Interfaces: ifaces})
		}
	case v.completed:
		if v.targetNode != node || v.targetPod == "" {
			break
		}
		// A resourceClaimName claim stays allocated on the source node: the
		// target pod cannot have a VF for it.
		var tmpl []vmiview.ClaimInterface
		for _, ci := range ifaces {
			if ci.FromTemplate() {
				tmpl = append(tmpl, ci)
			}
		}
		if len(tmpl) == 0 {
			break
		}
		dom := DomainName(vmi.Metadata.Namespace, vmi.Metadata.Name)
		if v.targetDomain != nil && v.targetDomainNamespace != nil {
			dom = DomainName(*v.targetDomainNamespace, *v.targetDomain)
		}
		out = append(out, Action{Side: Target, MigrationKey: v.key, PodName: v.targetPod, Domain: dom, Interfaces: tmpl})
	}
	return out
}

// DirectClaimInterfaces returns the interfaces backed by a named
// ResourceClaim (resourceClaimName), which cannot follow a live migration.
func DirectClaimInterfaces(ifaces []vmiview.ClaimInterface) []string {
	var out []string
	for _, ci := range ifaces {
		if !ci.FromTemplate() {
			out = append(out, ci.Interface.Name)
		}
	}
	return out
}

// MigrationStartedFrom reports the migration key if a migration of vmi from
// node is known (any state), for the not-migratable warning.
func MigrationStartedFrom(vmi *vmiview.VMI, node string) (string, bool) {
	ms := vmi.Status.MigrationState
	if ms == nil {
		return "", false
	}
	v := viewOf(ms)
	if v.key == "" || v.sourceNode != node {
		return "", false
	}
	return v.key, true
}
