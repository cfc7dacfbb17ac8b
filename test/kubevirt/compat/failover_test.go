package compat

import (
	"encoding/xml"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	v1 "kubevirt.io/api/core/v1"
	pluginv1alpha1 "kubevirt.io/api/plugin/v1alpha1"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/plugins"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmltree"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmlvalidate"
)

// kubeVirtLibvirtXML is the libvirtxml version KubeVirt v1.9.0 vendors
// (vendor/modules.txt): the one its migratableDomXML links.
const kubeVirtLibvirtXML = "v1.12002.0"

// standbyAliasPrefix is pkg/contract/standby.AliasPrefix.
const standbyAliasPrefix = "ua-vfnet-sb-"

// failoverCase is the golden case with a masquerade interface and two
// vfnet interfaces (one MAC from the VMI, one from the metadata only),
// both asking for failover.
func failoverCase(t *testing.T) (in, vmiJSON []byte, vmi *v1.VirtualMachineInstance, root string) {
	t.Helper()
	var c golden.Case
	for _, gc := range golden.Cases() {
		if gc.Name == "two-vfnet-masquerade" {
			c = gc
		}
	}
	if c.Name == "" {
		t.Fatal("golden case two-vfnet-masquerade is gone: pick another with two vfnet interfaces")
	}
	in, vmiJSON, vmi = loadGolden(t, c.Name)
	root = t.TempDir()
	claims, err := c.Claims()
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims {
		for i := range cl.Devices {
			cl.Devices[i].Failover = true
		}
		if _, err := cl.Write(root); err != nil {
			t.Fatal(err)
		}
	}
	return in, vmiJSON, vmi, root
}

// standbyInterfaces returns vfnet's standby <interface> elements of a
// domain, by alias.
func standbyInterfaces(t *testing.T, domainXML string) map[string]*xmltree.Node {
	t.Helper()
	tree, err := xmltree.Parse([]byte(domainXML))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*xmltree.Node{}
	for _, n := range tree.Find(func(n *xmltree.Node) bool {
		a := n.Child("alias")
		return n.Name.Local == "interface" && a != nil && strings.HasPrefix(a.Attr("name"), standbyAliasPrefix)
	}) {
		out[n.Child("alias").Attr("name")] = n
	}
	return out
}

// describeStandby is what the failover pair depends on in a standby
// element: type, MAC, tap and whether libvirt may manage it, model,
// teaming, ROM.
func describeStandby(n *xmltree.Node) string {
	attr := func(child, name string) string {
		if c := n.Child(child); c != nil {
			return c.Attr(name)
		}
		return "<none>"
	}
	return fmt.Sprintf("type=%s mac=%s target=%s managed=%s model=%s teaming=%s rom=%s", n.Attr("type"), attr("mac", "address"),
		attr("target", "dev"), attr("target", "managed"), attr("model", "type"), attr("teaming", "type"), attr("rom", "enabled"))
}

// TestFailoverStandbySurvivesMigratableXML runs the real vfnet-binding on
// a golden KubeVirt v1.9.0 domain whose two vfnet claims ask for failover
// and checks what each KubeVirt step after OnDefineDomain does to the
// standby interfaces:
//   - the output passes libvirt's schema (virt-xml-validate);
//   - virt-launcher's ApplySidecarHooks parse into api.DomainSpec works
//     (the string itself is what it defines);
//   - migratableDomXML's round trip (live-migration-source.go: the
//     MIGRATABLE XML unmarshalled into libvirtxml.Domain and marshalled
//     back, with the libvirtxml KubeVirt v1.9.0 links) keeps every part
//     of each standby, <teaming type='persistent'/> included;
//   - the VEP-190 plugin pipeline (plugins.ApplyDomainHooks, entered when
//     any Plugin is installed) drops <teaming>: it restarts from
//     api.DomainSpec, whose Interface has no teaming field. This pins the
//     exception docs/migration.md names; when KubeVirt models teaming it
//     fails, and the docs change.
func TestFailoverStandbySurvivesMigratableXML(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	if err := xmlvalidate.Available(); err != nil {
		t.Fatal(err)
	}
	checkLibvirtXMLVersion(t)
	in, vmiJSON, vmi, root := failoverCase(t)
	out, err := defineThroughBinding(t, bin, root, golden.BindingName, in, vmiJSON)
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]string{}
	for alias, n := range standbyInterfaces(t, string(out)) {
		want[alias] = describeStandby(n)
	}
	if len(want) != 2 || want[standbyAliasPrefix+"net-a"] == "" || want[standbyAliasPrefix+"net-b"] == "" {
		t.Fatalf("standbys %v, want one for net-a and one for net-b", want)
	}
	for alias, d := range want {
		for _, part := range []string{"type=ethernet ", "target=vfsb", "managed=no ", "model=virtio ", "teaming=persistent ", "rom=no"} {
			if !strings.Contains(d, part) {
				t.Errorf("%s: %s lacks %s", alias, d, part)
			}
		}
	}
	if !strings.Contains(want[standbyAliasPrefix+"net-a"], "mac=02:00:00:00:0a:01 ") || !strings.Contains(want[standbyAliasPrefix+"net-b"], "mac=aa:bb:cc:00:00:07 ") {
		t.Errorf("standby MACs are not the VFs': %v", want)
	}
	if err := xmlvalidate.Domain(t.Context(), xmlvalidate.StripKubeVirtEmpties(out)); err != nil {
		t.Errorf("output (KubeVirt's empties stripped) fails the schema: %v", err)
	}

	// ApplySidecarHooks: xml.Unmarshal into api.DomainSpec.
	var spec api.DomainSpec
	if err := xml.Unmarshal(out, &spec); err != nil {
		t.Fatalf("virt-launcher's parse of the sidecar's domain: %v", err)
	}

	// migratableDomXML's round trip.
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatalf("libvirtxml %s unmarshal: %v", kubeVirtLibvirtXML, err)
	}
	migratable, err := dom.Marshal()
	if err != nil {
		t.Fatalf("libvirtxml %s marshal: %v", kubeVirtLibvirtXML, err)
	}
	got := standbyInterfaces(t, migratable)
	for alias, w := range want {
		if n, ok := got[alias]; !ok {
			t.Errorf("%s lost in the migratable round trip", alias)
		} else if d := describeStandby(n); d != w {
			t.Errorf("%s after the migratable round trip:\n %s\nwant\n %s", alias, d, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d standbys after the round trip, want %d", len(got), len(want))
	}
	if err := xmlvalidate.Domain(t.Context(), xmlvalidate.StripKubeVirtEmpties([]byte(migratable))); err != nil {
		t.Errorf("the migratable domain fails the schema: %v", err)
	}

	// The VEP-190 exception: a hookless Plugin is enough to enter the
	// pipeline, which re-renders the domain from the parsed spec.
	_, pluginXML, err := plugins.ApplyDomainHooks([]pluginv1alpha1.Plugin{{}}, vmi, &spec, pluginv1alpha1.InvocationContextBoot)
	if err != nil {
		t.Fatal(err)
	}
	after := standbyInterfaces(t, pluginXML)
	if len(after) != len(want) {
		t.Fatalf("the plugin pipeline kept %d of %d standbys", len(after), len(want))
	}
	for alias, n := range after {
		if n.Child("teaming") != nil {
			t.Errorf("%s keeps <teaming> through KubeVirt's VEP-190 plugin pipeline: KubeVirt now models it; drop the exception from docs/migration.md (Failover)", alias)
		}
	}
}

// checkLibvirtXMLVersion fails unless this module builds with the
// libvirtxml KubeVirt v1.9.0 vendors: the round trip is only KubeVirt's
// with it. (A test binary carries no dependency list, so the module graph
// is asked.)
func checkLibvirtXMLVersion(t *testing.T) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}{{with .Replace}} => {{.Version}}{{end}}", "libvirt.org/go/libvirtxml").Output()
	if err != nil {
		t.Fatalf("go list -m libvirt.org/go/libvirtxml: %v", err)
	}
	if v := strings.TrimSpace(string(out)); v != kubeVirtLibvirtXML {
		t.Fatalf("this module builds with libvirtxml %s, KubeVirt v1.9.0 vendors %s: the round trip would not be KubeVirt's", v, kubeVirtLibvirtXML)
	}
}
