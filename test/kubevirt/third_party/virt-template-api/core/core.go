// Package core is a minimal stand-in for kubevirt.io/virt-template-api/core,
// holding only the constants kubevirt.io/kubevirt/pkg/controller refers to.
package core

const (
	GroupName            = "template.kubevirt.io"
	SingularResourceName = "virtualmachinetemplate"
	PluralResourceName   = "virtualmachinetemplates"
)
