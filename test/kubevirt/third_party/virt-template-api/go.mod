// Local stand-in for kubevirt.io/virt-template-api (the module proxy does
// not serve it): only the names KubeVirt v1.9.0's pkg/controller and
// virt-controller's export controller use. Not the real API.
module kubevirt.io/virt-template-api

go 1.26

require k8s.io/apimachinery v0.34.2
