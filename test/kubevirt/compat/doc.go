// Package compat holds the tests that run the product's real vfnet-binding
// binary against KubeVirt v1.9.0's own code: golden domain XML from KubeVirt's
// converter, KubeVirt's hook manager discovering and calling the sidecar as
// virt-launcher does, and KubeVirt's DRA metadata reader and SR-IOV hostdev
// builder as the reference for what the sidecar must write.
package compat
