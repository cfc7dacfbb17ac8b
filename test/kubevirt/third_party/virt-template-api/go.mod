// Local stand-in for kubevirt.io/virt-template-api: only the names
// kubevirt.io/kubevirt/pkg/controller uses. Not the real API.
module kubevirt.io/virt-template-api

go 1.26

require k8s.io/apimachinery v0.34.2
