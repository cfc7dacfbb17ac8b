// Package crds renders KubeVirt v1.9.0's own CustomResourceDefinitions, made
// by virt-operator's generator code, as YAML an API server accepts. The
// end-to-end harness applies them so VMI objects are validated by KubeVirt's
// real schemas rather than a hand-written stand-in.
package crds

import (
	"fmt"
	"os"
	"path/filepath"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

// generators are the CRDs the e2e flow needs: VMIs and VMs, the KubeVirt CR
// the binding is registered in, and migrations.
var generators = []func() (*extv1.CustomResourceDefinition, error){
	components.NewVirtualMachineInstanceCrd,
	components.NewVirtualMachineCrd,
	components.NewKubeVirtCrd,
	components.NewVirtualMachineInstanceMigrationCrd,
}

// All returns the generated CRDs, in a fixed order.
func All() ([]*extv1.CustomResourceDefinition, error) {
	out := make([]*extv1.CustomResourceDefinition, 0, len(generators))
	for _, gen := range generators {
		crd, err := gen()
		if err != nil {
			return nil, fmt.Errorf("generate KubeVirt CRD: %w", err)
		}
		out = append(out, crd)
	}
	return out, nil
}

// Write writes each CRD to dir/<crd name>.yaml and returns the file paths.
func Write(dir string) ([]string, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CRD output dir: %w", err)
	}
	var paths []string
	for _, crd := range all {
		// The status stanza is server-owned; an empty one is noise for apply.
		crd.Status = extv1.CustomResourceDefinitionStatus{}
		data, err := yaml.Marshal(crd)
		if err != nil {
			return nil, fmt.Errorf("marshal CRD %s: %w", crd.Name, err)
		}
		p := filepath.Join(dir, crd.Name+".yaml")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return nil, fmt.Errorf("write CRD %s: %w", crd.Name, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
