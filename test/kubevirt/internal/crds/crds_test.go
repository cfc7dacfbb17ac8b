package crds

import (
	"os"
	"path/filepath"
	"testing"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

func TestWriteProducesApplyableCRDs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	paths, err := Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"virtualmachineinstances.kubevirt.io":          false,
		"virtualmachines.kubevirt.io":                  false,
		"kubevirts.kubevirt.io":                        false,
		"virtualmachineinstancemigrations.kubevirt.io": false,
	}
	if len(paths) != len(want) {
		t.Fatalf("wrote %d files, want %d", len(paths), len(want))
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var crd extv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if crd.APIVersion != "apiextensions.k8s.io/v1" || crd.Kind != "CustomResourceDefinition" {
			t.Errorf("%s: apiVersion/kind %s/%s", p, crd.APIVersion, crd.Kind)
		}
		if filepath.Base(p) != crd.Name+".yaml" {
			t.Errorf("%s holds %s", p, crd.Name)
		}
		if _, ok := want[crd.Name]; !ok {
			t.Errorf("unexpected CRD %s", crd.Name)
		}
		want[crd.Name] = true
		served := false
		for _, v := range crd.Spec.Versions {
			if v.Name == "v1" && v.Served && v.Storage {
				served = true
				if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
					t.Errorf("%s v1 has no schema: the API server would not validate", crd.Name)
				}
			}
		}
		if !served {
			t.Errorf("%s: no served storage version v1", crd.Name)
		}
		if crd.Name == "virtualmachineinstances.kubevirt.io" {
			assertDRANetworkSchema(t, &crd)
		}
	}
}

// assertDRANetworkSchema: the VMI schema must know spec.networks[].resourceClaim
// and spec.resourceClaims, or the API server would prune the very fields vfnet uses.
func assertDRANetworkSchema(t *testing.T, crd *extv1.CustomResourceDefinition) {
	t.Helper()
	for _, v := range crd.Spec.Versions {
		if v.Name != "v1" {
			continue
		}
		spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
		if _, ok := spec.Properties["resourceClaims"]; !ok {
			t.Error("VMI schema lacks spec.resourceClaims")
		}
		nets := spec.Properties["networks"]
		if nets.Items == nil || nets.Items.Schema == nil {
			t.Fatal("VMI schema lacks spec.networks items")
		}
		if _, ok := nets.Items.Schema.Properties["resourceClaim"]; !ok {
			t.Error("VMI schema lacks spec.networks[].resourceClaim")
		}
	}
}
