package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
	"github.com/vfnet-io/vfnet/sidecar/server"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/metadatatest"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
)

// bytesReader serves the same metadata bytes for every claim, so a fuzzer
// controls the metadata without touching the file system.
type bytesReader []byte

func (b bytesReader) Read(kubevirtvmi.ClaimInterface) (*metadata.Device, error) {
	return metadata.Decode(b)
}

func wellFormed(doc []byte) error {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	for {
		if _, err := dec.Token(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// FuzzOnDefineDomain feeds arbitrary (VMI JSON, domain XML, metadata)
// triples through the OnDefineDomain handler (no panic recovery in between).
// Beyond "no panic" it checks that a success yields well-formed XML that a
// second call leaves unchanged.
func FuzzOnDefineDomain(f *testing.F) {
	boot := uint(1)
	vmis := []*kubevirtv1.VirtualMachineInstance{
		sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build(),
		sidecartest.NewVMI().VFNet("dra-net", "net", "vf", func(i *kubevirtv1.Interface) {
			i.MacAddress, i.PciAddress, i.BootOrder = "02:00:00:00:00:01", "0000:0a:01.0", &boot
		}).Other("tap", "passt").Build(),
		sidecartest.NewVMI().Build(),
	}
	docs := [][]byte{
		sidecartest.ReadFile(f, "../domain/testdata/q35.xml"),
		sidecartest.ReadFile(f, "../domain/testdata/compact.xml"),
		sidecartest.ReadFile(f, "../domain/testdata/earlier-call.xml"),
		[]byte(`<domain><devices/></domain>`),
	}
	md := metadatatest.Stream(metadatatest.Claim{Namespace: "vms", Name: "c", PodClaimName: "net", Request: "vf"}, metadatatest.VF("0000:3b:02.1", "02:00:00:00:00:01"))
	for i, v := range vmis {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, docs[i%len(docs)], md)
	}
	vj, _ := json.Marshal(vmis[0])
	f.Add(vj, docs[3], md)
	f.Add(vj, docs[2], []byte(`{"apiVersion":"metadata.resource.k8s.io/v1alpha1","kind":"DeviceMetadata"}`))
	f.Add([]byte(`{"status":{"migrationState":{"targetPod":"p"}}}`), []byte(`<domain/>`), []byte(`{}`))

	f.Fuzz(func(t *testing.T, vmiJSON, domainXML, meta []byte) {
		cb := &server.Callbacks{BindingName: "vfnet", Reader: bytesReader(meta)}
		res, err := cb.OnDefineDomain(context.Background(), &v1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
		if err != nil {
			return
		}
		out := res.GetDomainXML()
		if bytes.Equal(out, domainXML) {
			return
		}
		if err := wellFormed(out); err != nil {
			t.Fatalf("output is not well-formed XML: %v\n%s", err, out)
		}
		again, err := cb.OnDefineDomain(context.Background(), &v1alpha3.OnDefineDomainParams{DomainXML: out, Vmi: vmiJSON})
		if err != nil {
			t.Fatalf("second call failed: %v\n%s", err, out)
		}
		if !bytes.Equal(again.GetDomainXML(), out) {
			t.Fatalf("second call changed the output:\n--- first:\n%s\n--- second:\n%s", out, again.GetDomainXML())
		}
	})
}
