//go:build deps

// Package hack pins the product's libraries while packages are being written.
package hack

import (
	_ "github.com/digitalocean/go-libvirt"
	_ "github.com/vishvananda/netlink"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/proto"
	_ "k8s.io/api/resource/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/component-base/logs"
	_ "k8s.io/component-base/metrics"
	_ "k8s.io/dynamic-resource-allocation/deviceattribute"
	_ "k8s.io/dynamic-resource-allocation/devicemetadata"
	_ "k8s.io/dynamic-resource-allocation/kubeletplugin"
	_ "k8s.io/dynamic-resource-allocation/resourceslice"
	_ "k8s.io/dynamic-resource-allocation/structured"
	_ "k8s.io/kubelet/pkg/apis/dra/v1"
	_ "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	_ "kubevirt.io/api/core/v1"
	_ "libvirt.org/go/libvirtxml"
	_ "sigs.k8s.io/yaml"
	_ "tags.cncf.io/container-device-interface/pkg/cdi"
	_ "tags.cncf.io/container-device-interface/specs-go"
)
