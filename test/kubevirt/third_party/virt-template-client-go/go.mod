// Local stand-in for kubevirt.io/virt-template-client-go: only the names
// kubevirt.io/kubevirt/pkg/controller uses. Not the real client.
module kubevirt.io/virt-template-client-go

go 1.26

require k8s.io/client-go v0.34.2
