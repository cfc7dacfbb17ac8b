package server_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
	"github.com/vfnet-io/vfnet/sidecar/server"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
)

// BenchmarkOnDefineDomain8VFs measures one OnDefineDomain call for a VM
// with eight vfnet interfaces plus the pod network, reading real metadata
// files, on KubeVirt-shaped q35 XML without and with the hostdevs from an
// earlier call (the launcher's second and third calls look like this), with
// the CachingReader vfnet-binding uses (files unchanged since the previous
// call: one stat each) and with the uncached FileReader (every file decoded).
func BenchmarkOnDefineDomain8VFs(b *testing.B) {
	root := b.TempDir()
	builder := sidecartest.NewVMI()
	for i := range 8 {
		claim := fmt.Sprintf("net-%d", i)
		sidecartest.WriteVF(b, root, claim, "vf", fmt.Sprintf("0000:3b:02.%d", i), fmt.Sprintf("02:00:00:00:00:%02x", i))
		builder.VFNet(fmt.Sprintf("data-%d", i), claim, "vf", func(iface *kubevirtv1.Interface) {
			iface.MacAddress = fmt.Sprintf("02:00:00:00:00:%02x", i)
		})
	}
	vmi := vmiJSON(b, builder.Build())
	ctx := context.Background()
	for _, rc := range []struct {
		name   string
		reader domain.MetadataReader
	}{{"cached", metadata.NewCachingReader(root)}, {"uncached", metadata.FileReader{Root: root}}} {
		cb := &server.Callbacks{BindingName: "vfnet", Reader: rc.reader, Hostdevs: domain.NewHostdevCache()}
		first, err := cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: q35(b), Vmi: vmi})
		if err != nil {
			b.Fatal(err)
		}
		for _, bc := range []struct {
			name string
			dom  []byte
		}{{"first-call", q35(b)}, {"repeat-call", first.GetDomainXML()}} {
			b.Run(rc.name+"/"+bc.name, func(b *testing.B) {
				p := &v1alpha3.OnDefineDomainParams{DomainXML: bc.dom, Vmi: vmi}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := cb.OnDefineDomain(ctx, p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkOnDefineDomain8VFsOverSocket is BenchmarkOnDefineDomain8VFs
// (cached, first call) through the real gRPC server on a unix socket, as
// virt-launcher calls it: what gRPC adds to the handler.
func BenchmarkOnDefineDomain8VFsOverSocket(b *testing.B) {
	root := b.TempDir()
	builder := sidecartest.NewVMI()
	for i := range 8 {
		claim := fmt.Sprintf("net-%d", i)
		sidecartest.WriteVF(b, root, claim, "vf", fmt.Sprintf("0000:3b:02.%d", i), fmt.Sprintf("02:00:00:00:00:%02x", i))
		builder.VFNet(fmt.Sprintf("data-%d", i), claim, "vf", nil)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	defer cancel()
	srv, err := server.New(ctx, server.Config{SocketDir: shortDir(b), BindingName: "vfnet", Reader: metadata.NewCachingReader(root)})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	conn, err := grpc.NewClient("unix://"+srv.Path(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	cb := v1alpha3.NewCallbacksClient(conn)
	p := &v1alpha3.OnDefineDomainParams{DomainXML: q35(b), Vmi: vmiJSON(b, builder.Build())}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cb.OnDefineDomain(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
}
