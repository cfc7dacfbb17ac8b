// Package kvdeps pins the KubeVirt v1.9.0 packages this module exercises, so
// that `go build ./...` compiles all of them even before every test uses them.
package kvdeps

import (
	_ "kubevirt.io/kubevirt/cmd/sidecars/network-passt-binding/server"
	_ "kubevirt.io/kubevirt/pkg/dra"
	_ "kubevirt.io/kubevirt/pkg/dra/admitter"
	_ "kubevirt.io/kubevirt/pkg/hooks"
	_ "kubevirt.io/kubevirt/pkg/network/admitter"
	_ "kubevirt.io/kubevirt/pkg/testutils"
	_ "kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	_ "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	_ "kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)
