package node

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	virtv1 "kubevirt.io/api/core/v1"
)

// The virt-handler stand-in's part in a live migration: each method writes
// only the VMI fields KubeVirt v1.9.0's virt-handler writes at that point
// (the function named in each comment, under pkg/virt-handler), as the
// handler of this stand-in's node. What virt-handler does besides (run the
// migration proxy, drive libvirt's migration, unplug the source's
// ua-sriov-* hostdevs) the tier cannot: no QEMU runs here.

// ReportDomainRunning is what virt-handler writes once the VMI's domain runs
// on its node: phase Running and, on a node without SELinux, the context
// "none" (vm.go, the SELinux part of updateVMIStatus); virt-controller's
// migration target pod copies the context's level from it.
func (s *VirtHandlerStandIn) ReportDomainRunning(ctx context.Context, ns, name string) error {
	return s.updateVMI(ctx, ns, name, "domain running", func(vmi *virtv1.VirtualMachineInstance) error {
		vmi.Status.Phase = virtv1.Running
		vmi.Status.SelinuxContext = "none"
		return nil
	})
}

// TargetPrepared: the target's handler advertises where its migration proxy
// listens (migration-target.go, prepareMigrationTarget): the node's IP.
// Ports are left out: no proxy listens and nothing reads them but the
// source's handler.
func (s *VirtHandlerStandIn) TargetPrepared(ctx context.Context, ns, name string) error {
	return s.updateVMI(ctx, ns, name, "migration target prepared", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, true)
		if err != nil {
			return err
		}
		ms.TargetNodeAddress = s.Node.Spec.IP
		return nil
	})
}

// TargetDomainReady: the target's handler sees the incoming domain and then
// see it run (migration-target.go, updateStatus).
func (s *VirtHandlerStandIn) TargetDomainReady(ctx context.Context, ns, name string) error {
	return s.updateVMI(ctx, ns, name, "migration target domain ready", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, true)
		if err != nil {
			return err
		}
		ms.TargetNodeDomainDetected = true
		ms.TargetNodeDomainReadyTimestamp = ptrNow()
		return nil
	})
}

// SourceStarted: the source's handler reports the migration running
// (migration-source.go, setMigrationProgressStatus: start time and mode).
func (s *VirtHandlerStandIn) SourceStarted(ctx context.Context, ns, name string) error {
	return s.updateVMI(ctx, ns, name, "migration started", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, false)
		if err != nil {
			return err
		}
		ms.StartTimestamp = ptrNow()
		ms.Mode = virtv1.MigrationPreCopy
		return nil
	})
}

// SourceFailed: the source's handler reports the migration failed
// (migration-source.go, setMigrationProgressStatus with Failed metadata).
func (s *VirtHandlerStandIn) SourceFailed(ctx context.Context, ns, name, reason string) error {
	return s.updateVMI(ctx, ns, name, "migration failed", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, false)
		if err != nil {
			return err
		}
		ms.Failed, ms.Completed = true, true
		ms.EndTimestamp = ptrNow()
		ms.FailureReason = reason
		return nil
	})
}

// TargetAckCompleted: the target's handler acknowledges the completed
// migration (migration-target.go, ackMigrationCompletion: end time, the
// VMI's node and node label move to the target, the transport becomes
// unix) and then finalizes it (finalizeMigration: completed).
func (s *VirtHandlerStandIn) TargetAckCompleted(ctx context.Context, ns, name string) error {
	err := s.updateVMI(ctx, ns, name, "migration acknowledged", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, true)
		if err != nil {
			return err
		}
		ms.EndTimestamp = ptrNow()
		if vmi.Labels == nil {
			vmi.Labels = map[string]string{}
		}
		vmi.Labels[virtv1.NodeNameLabel] = s.Node.Spec.Name
		vmi.Status.NodeName = s.Node.Spec.Name
		vmi.Status.LauncherContainerImageVersion = ""
		vmi.Status.EvacuationNodeName = ""
		vmi.Status.MigrationTransport = virtv1.MigrationTransportUnix
		return nil
	})
	if err != nil {
		return err
	}
	return s.updateVMI(ctx, ns, name, "migration finalized", func(vmi *virtv1.VirtualMachineInstance) error {
		ms, err := s.migrationState(vmi, true)
		if err != nil {
			return err
		}
		ms.Completed = true
		return nil
	})
}

// migrationState is the VMI's migration state if this stand-in's node is
// its target (target) or source (!target).
func (s *VirtHandlerStandIn) migrationState(vmi *virtv1.VirtualMachineInstance, target bool) (*virtv1.VirtualMachineInstanceMigrationState, error) {
	ms := vmi.Status.MigrationState
	if ms == nil {
		return nil, fmt.Errorf("no status.migrationState: virt-controller has not handed the migration off")
	}
	node, role := ms.SourceNode, "source"
	if target {
		node, role = ms.TargetNode, "target"
	}
	if node != s.Node.Spec.Name {
		return nil, fmt.Errorf("status.migrationState names %s node %q, not this stand-in's %s", role, node, s.Node.Spec.Name)
	}
	return ms, nil
}

// updateVMI reads the VMI (list, as virt-handler's informer does), applies
// mutate and updates the whole object (the VMI CRD has no status
// subresource), retrying on conflicts.
func (s *VirtHandlerStandIn) updateVMI(ctx context.Context, ns, name, what string, mutate func(*virtv1.VirtualMachineInstance) error) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		list, err := s.dyn.Resource(vmiResource()).Namespace(ns).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("VMI not found")
		}
		vmi := &virtv1.VirtualMachineInstance{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[0].Object, vmi); err != nil {
			return err
		}
		if err := mutate(vmi); err != nil {
			return err
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
		if err != nil {
			return err
		}
		list.Items[0].Object = obj
		_, err = s.dyn.Resource(vmiResource()).Namespace(ns).Update(ctx, &list.Items[0], metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("virt-handler stand-in on %s: VMI %s/%s, %s: %w", s.Node.Spec.Name, ns, name, what, err)
	}
	return nil
}

func ptrNow() *metav1.Time {
	t := metav1.NewTime(time.Now())
	return &t
}
