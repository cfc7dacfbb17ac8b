package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/hookclient"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmltree"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmlvalidate"
)

const goldenDir = "../testdata/golden"

// loadGolden reads a case's committed inputs: the domain XML as the hook
// manager sends it and the VMI as compact JSON (what json.Marshal sends).
func loadGolden(t *testing.T, name string) (domainXML, vmiJSON []byte, vmi *v1.VirtualMachineInstance) {
	t.Helper()
	domainXML, err := os.ReadFile(golden.DomainFile(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	indented, err := os.ReadFile(golden.VMIFile(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, indented); err != nil {
		t.Fatal(err)
	}
	vmi = &v1.VirtualMachineInstance{}
	if err := json.Unmarshal(compact.Bytes(), vmi); err != nil {
		t.Fatal(err)
	}
	return domainXML, compact.Bytes(), vmi
}

func isOurHostdev(n *xmltree.Node) bool {
	if n.Name.Local != "hostdev" {
		return false
	}
	a := n.Child("alias")
	return a != nil && strings.HasPrefix(a.Attr("name"), "ua-sriov-")
}

// TestGoldenOnDefineDomain runs the real binary on every golden input and
// checks, per case:
//   - each vfnet interface got exactly the hostdev KubeVirt's own SR-IOV DRA
//     builder makes for the same interface and metadata;
//   - the output minus those hostdevs equals the input (nothing else changed,
//     including other bindings' interfaces, KubeVirt's metadata element and
//     the masquerade interface);
//   - virt-launcher can unmarshal the result into api.DomainSpec;
//   - three calls (each fed the previous output) equal one;
//   - input and output pass virt-xml-validate once KubeVirt's empty <bios/>,
//     <baseBoard/> and <chassis/> are removed from both (KubeVirt v1.9.0's
//     own domains fail the schema only because of those).
func TestGoldenOnDefineDomain(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	if err := xmlvalidate.Available(); err != nil {
		t.Fatal(err)
	}
	for _, c := range golden.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			in, vmiJSON, vmi := loadGolden(t, c.Name)
			root := t.TempDir()
			claims, err := c.Claims()
			if err != nil {
				t.Fatal(err)
			}
			for _, cl := range claims {
				if _, err := cl.Write(root); err != nil {
					t.Fatal(err)
				}
			}
			// One server for the three calls below: its hostdev cache is
			// part of what they check.
			sc, _ := startBinding(t, bin, root, golden.BindingName)
			client, err := hookclient.Dial(sc.Socket)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := client.OnDefineDomain(ctx, in, vmiJSON)
			if err != nil {
				t.Fatal(err)
			}

			// Hostdevs: same as KubeVirt's own for an SR-IOV DRA interface.
			want, err := kubeVirtSRIOVHostDevices(vmi, golden.BindingName, root)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) != len(c.VFs) {
				t.Fatalf("reference built %d hostdevs for %d VFs", len(want), len(c.VFs))
			}
			got, err := sriovHostDevices(out)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalizeHostDevices(got), normalizeHostDevices(want)) {
				t.Errorf("hostdevs differ from KubeVirt's SR-IOV DRA hostdevs\n got: %s\nwant: %s", describe(got), describe(want))
			}

			// Everything else: output minus our hostdevs is the input.
			inTree, err := xmltree.Parse(in)
			if err != nil {
				t.Fatal(err)
			}
			if n := inTree.Remove(isOurHostdev); n != 0 {
				t.Fatalf("golden input already has %d vfnet hostdevs", n)
			}
			outTree, err := xmltree.Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			if n := outTree.Remove(isOurHostdev); n != len(c.VFs) {
				t.Errorf("output has %d ua-sriov- hostdevs, want %d", n, len(c.VFs))
			}
			if a, b := outTree.String(), inTree.String(); a != b {
				t.Errorf("output changed more than the hostdevs:\n--- output minus hostdevs\n%s\n--- input\n%s", a, b)
			}

			// Idempotent: three calls = one.
			again := out
			for i := 0; i < 2; i++ {
				if again, err = client.OnDefineDomain(ctx, again, vmiJSON); err != nil {
					t.Fatalf("call %d: %v", i+2, err)
				}
			}
			t1, _ := xmltree.Parse(out)
			t3, err := xmltree.Parse(again)
			if err != nil {
				t.Fatal(err)
			}
			if t1.String() != t3.String() {
				t.Errorf("third call differs from the first:\n%s\n---\n%s", t3, t1)
			}

			// libvirt's schema, on input and output alike.
			if err := xmlvalidate.Domain(ctx, xmlvalidate.StripKubeVirtEmpties(in)); err != nil {
				t.Errorf("KubeVirt's input (empties stripped) fails the schema, so the stripping premise is wrong: %v", err)
			}
			if err := xmlvalidate.Domain(ctx, xmlvalidate.StripKubeVirtEmpties(out)); err != nil {
				t.Errorf("output (KubeVirt's empties stripped) fails the schema: %v", err)
			}
		})
	}
}

// TestGoldenInputNeedsStripping documents why the empties are removed: the
// unmodified KubeVirt input fails libvirt's schema. If KubeVirt stops writing
// them, this fails and the stripping can go.
func TestGoldenInputNeedsStripping(t *testing.T) {
	t.Parallel()
	if err := xmlvalidate.Available(); err != nil {
		t.Fatal(err)
	}
	in, _, _ := loadGolden(t, golden.Cases()[0].Name)
	if err := xmlvalidate.Domain(context.Background(), in); err == nil {
		t.Error("KubeVirt's unmodified domain now passes virt-xml-validate; drop StripKubeVirtEmpties")
	}
}

// TestMACMismatchIsRefused: an interface MAC that the VF does not carry
// must fail the call, naming the interface.
func TestMACMismatchIsRefused(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	c := golden.Cases()[0]
	in, vmiJSON, _ := loadGolden(t, c.Name)
	root := t.TempDir()
	claims, err := c.Claims()
	if err != nil {
		t.Fatal(err)
	}
	claims[0].Devices[0].MAC = "02:99:99:99:99:99"
	if _, err := claims[0].Write(root); err != nil {
		t.Fatal(err)
	}
	_, err = defineThroughBinding(t, bin, root, golden.BindingName, in, vmiJSON)
	if err == nil {
		t.Fatal("OnDefineDomain accepted a VF whose MAC differs from the interface's macAddress")
	}
	if !strings.Contains(err.Error(), c.VFs[0].Interface) {
		t.Errorf("error does not name interface %s: %v", c.VFs[0].Interface, err)
	}
}

// TestOtherBindingNameLeavesDomainAlone: a sidecar registered under another
// binding name must not touch vfnet interfaces.
func TestOtherBindingNameLeavesDomainAlone(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	c := golden.Cases()[0]
	in, vmiJSON, _ := loadGolden(t, c.Name)
	out, err := defineThroughBinding(t, bin, t.TempDir(), "notvfnet", in, vmiJSON)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := xmltree.Parse(in)
	b, err := xmltree.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Errorf("binding %q changed a domain with only %q interfaces", "notvfnet", golden.BindingName)
	}
}

// defineThroughBinding starts the vfnet-binding binary bin under binding
// name bindingName with its device metadata under root, and returns what
// its OnDefineDomain makes of the domain in for the VMI vmiJSON.
func defineThroughBinding(t *testing.T, bin, root, bindingName string, in, vmiJSON []byte) ([]byte, error) {
	t.Helper()
	sc, _ := startBinding(t, bin, root, bindingName)
	client, err := hookclient.Dial(sc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return client.OnDefineDomain(ctx, in, vmiJSON)
}
