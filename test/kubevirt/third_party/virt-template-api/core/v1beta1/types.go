// Package v1beta1 stands in for kubevirt.io/virt-template-api/core/v1beta1,
// which the module proxy does not serve. It declares only what the
// KubeVirt v1.9.0 code this module builds refers to: pkg/controller's
// informer factory (the type itself) and virt-controller's export
// controller (pkg/storage/export/export/vmtemplate-source.go: the embedded
// VirtualMachine, the parameters it substitutes, the Ready condition).
// None of it runs in the tests: the template informer starts only with
// the virt-template deployment, which the tier's KubeVirt CR turns off.
// The JSON names are the served API's, so an object of the real API
// decodes into these types field for field where they overlap.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ConditionReady is the condition the export controller waits for.
const ConditionReady = "Ready"

// VirtualMachineTemplate is a parameterised VirtualMachine.
type VirtualMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineTemplateSpec   `json:"spec"`
	Status VirtualMachineTemplateStatus `json:"status,omitempty"`
}

// VirtualMachineTemplateSpec is the template body.
type VirtualMachineTemplateSpec struct {
	// VirtualMachine is kept raw: its ${NAME} placeholders make it no
	// valid VirtualMachine until the parameters are substituted.
	VirtualMachine *runtime.RawExtension `json:"virtualMachine"`
	Parameters     []Parameter           `json:"parameters,omitempty"`
}

// Parameter names a placeholder and the value it takes. The real type has
// more (display name, generators, ...); the export controller reads these.
type Parameter struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
}

// VirtualMachineTemplateStatus is the template's observed state.
type VirtualMachineTemplateStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DeepCopy returns an independent copy (nil for nil).
func (t *VirtualMachineTemplate) DeepCopy() *VirtualMachineTemplate {
	if t == nil {
		return nil
	}
	out := &VirtualMachineTemplate{TypeMeta: t.TypeMeta}
	t.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if vm := t.Spec.VirtualMachine; vm != nil {
		out.Spec.VirtualMachine = vm.DeepCopy()
	}
	// Parameter holds only strings: a copied slice is a deep copy.
	out.Spec.Parameters = append([]Parameter(nil), t.Spec.Parameters...)
	for i := range t.Status.Conditions {
		var c metav1.Condition
		t.Status.Conditions[i].DeepCopyInto(&c)
		out.Status.Conditions = append(out.Status.Conditions, c)
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (t *VirtualMachineTemplate) DeepCopyObject() runtime.Object {
	if t == nil {
		return nil
	}
	return t.DeepCopy()
}
