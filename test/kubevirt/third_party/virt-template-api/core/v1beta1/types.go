// Package v1beta1 is a minimal stand-in for
// kubevirt.io/virt-template-api/core/v1beta1: just enough of
// VirtualMachineTemplate for pkg/controller's informer factory to compile.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// VirtualMachineTemplate carries only object metadata in this stand-in.
type VirtualMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (t *VirtualMachineTemplate) DeepCopyObject() runtime.Object {
	if t == nil {
		return nil
	}
	out := &VirtualMachineTemplate{TypeMeta: t.TypeMeta}
	t.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}
