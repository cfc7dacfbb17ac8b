// Package hooksapi_test pins the wire names and field numbers of vfnet's own
// hooks protobuf definitions to what KubeVirt's virt-launcher sends and
// expects (sidecar/README.md, "Behaviour"). A rename or renumbering in the .proto files
// breaks compatibility silently on the wire; this test makes it loud.
package hooksapi_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
)

func TestWireNames(t *testing.T) {
	t.Parallel()
	type field struct {
		name string
		num  protoreflect.FieldNumber
		kind protoreflect.Kind
		list bool
	}
	cases := []struct {
		msg    protoreflect.MessageDescriptor
		full   protoreflect.FullName
		fields []field
	}{
		{(&info.InfoParams{}).ProtoReflect().Descriptor(), "kubevirt.hooks.info.InfoParams", nil},
		{(&info.InfoResult{}).ProtoReflect().Descriptor(), "kubevirt.hooks.info.InfoResult", []field{
			{"name", 1, protoreflect.StringKind, false},
			{"hookPoints", 3, protoreflect.MessageKind, true},
			{"versions", 4, protoreflect.StringKind, true},
		}},
		{(&info.HookPoint{}).ProtoReflect().Descriptor(), "kubevirt.hooks.info.HookPoint", []field{
			{"name", 1, protoreflect.StringKind, false},
			{"priority", 2, protoreflect.Int32Kind, false},
		}},
		{(&v1alpha3.OnDefineDomainParams{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.OnDefineDomainParams", []field{
			{"domainXML", 1, protoreflect.BytesKind, false},
			{"vmi", 2, protoreflect.BytesKind, false},
		}},
		{(&v1alpha3.OnDefineDomainResult{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.OnDefineDomainResult", []field{
			{"domainXML", 1, protoreflect.BytesKind, false},
		}},
		{(&v1alpha3.PreCloudInitIsoParams{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.PreCloudInitIsoParams", []field{
			{"cloudInitNoCloudSource", 1, protoreflect.BytesKind, false},
			{"vmi", 2, protoreflect.BytesKind, false},
			{"cloudInitData", 3, protoreflect.BytesKind, false},
		}},
		{(&v1alpha3.PreCloudInitIsoResult{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.PreCloudInitIsoResult", []field{
			{"cloudInitNoCloudSource", 1, protoreflect.BytesKind, false},
			{"cloudInitData", 3, protoreflect.BytesKind, false},
		}},
		{(&v1alpha3.ShutdownParams{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.ShutdownParams", nil},
		{(&v1alpha3.ShutdownResult{}).ProtoReflect().Descriptor(), "kubevirt.hooks.v1alpha3.ShutdownResult", nil},
	}
	for _, c := range cases {
		if c.msg.FullName() != c.full {
			t.Errorf("message %s: want full name %s", c.msg.FullName(), c.full)
		}
		if got := c.msg.Fields().Len(); got != len(c.fields) {
			t.Errorf("%s: %d fields, want %d", c.full, got, len(c.fields))
		}
		for _, f := range c.fields {
			fd := c.msg.Fields().ByName(protoreflect.Name(f.name))
			if fd == nil {
				t.Errorf("%s: no field %s", c.full, f.name)
				continue
			}
			if fd.Number() != f.num || fd.Kind() != f.kind || fd.IsList() != f.list {
				t.Errorf("%s.%s: number %d kind %v list %v, want %d %v %v", c.full, f.name, fd.Number(), fd.Kind(), fd.IsList(), f.num, f.kind, f.list)
			}
		}
	}
}

func TestServiceMethods(t *testing.T) {
	t.Parallel()
	if info.Info_Info_FullMethodName != "/kubevirt.hooks.info.Info/Info" {
		t.Errorf("Info method %s", info.Info_Info_FullMethodName)
	}
	want := map[string]string{
		v1alpha3.Callbacks_OnDefineDomain_FullMethodName:  "/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain",
		v1alpha3.Callbacks_PreCloudInitIso_FullMethodName: "/kubevirt.hooks.v1alpha3.Callbacks/PreCloudInitIso",
		v1alpha3.Callbacks_Shutdown_FullMethodName:        "/kubevirt.hooks.v1alpha3.Callbacks/Shutdown",
	}
	for got, w := range want {
		if got != w {
			t.Errorf("method %s, want %s", got, w)
		}
	}
}
