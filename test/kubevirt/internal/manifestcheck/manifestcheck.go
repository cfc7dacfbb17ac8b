// Package manifestcheck holds the product's KubeVirt-facing manifests to
// KubeVirt v1.9.0's own rules: every kubevirt.io object decodes strictly
// (unknown or duplicate fields are errors) into kubevirt.io/api types, and
// every VirtualMachine passes virt-api's VirtualMachine spec validation
// (ValidateVirtualMachineSpec, which runs the network and DRA admitters) with
// a cluster configuration built from the product's KubeVirt CR patch.
package manifestcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfield "k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	v1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	"kubevirt.io/kubevirt/pkg/virt-config/featuregate"
)

// Objects are the kubevirt.io objects found in a set of manifest files.
type Objects struct {
	KubeVirts []Located[*v1.KubeVirt]
	VMs       []Located[*v1.VirtualMachine]
	VMIs      []Located[*v1.VirtualMachineInstance]
}

// Located is an object with the file and document index it came from.
type Located[T any] struct {
	File string
	Doc  int
	Obj  T
}

func (l Located[T]) String() string { return fmt.Sprintf("%s (document %d)", l.File, l.Doc) }

// YAMLFiles lists *.yaml and *.yml in dir, sorted; none is not an error.
func YAMLFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// DecodeFiles strictly decodes the kubevirt.io objects in files. Documents of
// other API groups (kustomize files, ResourceClaimTemplates, ...) are left to
// the checks that own them; a kubevirt.io kind this package does not know is
// an error, so nothing is silently skipped.
func DecodeFiles(files ...string) (Objects, error) {
	var objs Objects
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return objs, fmt.Errorf("read manifest: %w", err)
		}
		if err := decodeStream(f, data, &objs); err != nil {
			return objs, err
		}
	}
	return objs, nil
}

func decodeStream(file string, data []byte, objs *Objects) error {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 0; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: split YAML document %d: %w", file, doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return fmt.Errorf("%s document %d: read apiVersion/kind: %w", file, doc, err)
		}
		if !strings.HasPrefix(tm.APIVersion, "kubevirt.io/") {
			continue
		}
		if tm.APIVersion != v1.SchemeGroupVersion.String() {
			return fmt.Errorf("%s document %d: apiVersion %s: KubeVirt v1.9.0 serves kubevirt.io/v1", file, doc, tm.APIVersion)
		}
		switch tm.Kind {
		case "KubeVirt":
			obj := &v1.KubeVirt{}
			if err := strict(raw, obj); err != nil {
				return fmt.Errorf("%s document %d (KubeVirt): %w", file, doc, err)
			}
			objs.KubeVirts = append(objs.KubeVirts, Located[*v1.KubeVirt]{file, doc, obj})
		case "VirtualMachine":
			obj := &v1.VirtualMachine{}
			if err := strict(raw, obj); err != nil {
				return fmt.Errorf("%s document %d (VirtualMachine): %w", file, doc, err)
			}
			objs.VMs = append(objs.VMs, Located[*v1.VirtualMachine]{file, doc, obj})
		case "VirtualMachineInstance":
			obj := &v1.VirtualMachineInstance{}
			if err := strict(raw, obj); err != nil {
				return fmt.Errorf("%s document %d (VirtualMachineInstance): %w", file, doc, err)
			}
			objs.VMIs = append(objs.VMIs, Located[*v1.VirtualMachineInstance]{file, doc, obj})
		default:
			return fmt.Errorf("%s document %d: kind %s of kubevirt.io/v1 is not checked here; add it", file, doc, tm.Kind)
		}
	}
}

// strict decodes YAML into obj, refusing duplicate fields, type errors and
// unknown fields at any depth (see unknownFields for why the decoder's own
// check is not enough).
func strict(raw []byte, obj any) error {
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		return fmt.Errorf("strict decode into kubevirt.io/api v1.9.0 types: %w", err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("decode YAML: %w", err)
	}
	if unknown := unknownFields(doc, reflect.TypeOf(obj)); len(unknown) > 0 {
		return fmt.Errorf("unknown fields for kubevirt.io/api v1.9.0 %T: %s", obj, strings.Join(unknown, ", "))
	}
	return nil
}

// ClusterConfig is the KubeVirt configuration a VM is admitted under: the CR
// patch's spec.configuration, plus any of extraGates it does not enable.
// It returns the gates that had to be added.
func ClusterConfig(kv *v1.KubeVirt, extraGates ...string) (*v1.KubeVirtConfiguration, []string) {
	cfg := kv.Spec.Configuration.DeepCopy()
	if cfg.DeveloperConfiguration == nil {
		cfg.DeveloperConfiguration = &v1.DeveloperConfiguration{}
	}
	var added []string
	for _, g := range extraGates {
		if !slices.Contains(cfg.DeveloperConfiguration.FeatureGates, g) {
			cfg.DeveloperConfiguration.FeatureGates = append(cfg.DeveloperConfiguration.FeatureGates, g)
			added = append(added, g)
		}
	}
	return cfg, added
}

// RequiredGates are the feature gates a vfnet VM needs (docs/install.md):
// DRA networks, and memLock: Required for VFIO locked memory.
var RequiredGates = []string{featuregate.NetworkDevicesWithDRAGate, featuregate.ReservedOverheadMemlock}

// ValidateVM runs virt-api's VirtualMachine spec validation, as the VM
// admitter does for a user's create, under cfg.
func ValidateVM(vm *v1.VirtualMachine, cfg *v1.KubeVirtConfiguration) []metav1.StatusCause {
	clusterConfig, _, _ := testutils.NewFakeClusterConfigUsingKVConfig(cfg)
	return admitters.ValidateVirtualMachineSpec(k8sfield.NewPath("spec"), &vm.Spec, clusterConfig, false)
}

// ValidateVMI runs virt-api's VMI spec validation under cfg.
func ValidateVMI(vmi *v1.VirtualMachineInstance, cfg *v1.KubeVirtConfiguration) []metav1.StatusCause {
	clusterConfig, _, _ := testutils.NewFakeClusterConfigUsingKVConfig(cfg)
	return admitters.ValidateVirtualMachineInstanceSpec(k8sfield.NewPath("spec"), &vmi.Spec, clusterConfig)
}

// BindingRegistration checks, beyond KubeVirt's own admission (which does
// not look at binding registrations), that every binding plugin the VM's
// interfaces name is registered in cfg with a sidecar image: without it
// virt-controller cannot render the pod. (VFIO's memory is the VM's own
// reservedOverhead, which vmirender's memlock test checks.)
func BindingRegistration(spec *v1.VirtualMachineInstanceSpec, cfg *v1.KubeVirtConfiguration) []string {
	var problems []string
	for _, iface := range spec.Domain.Devices.Interfaces {
		if iface.Binding == nil {
			continue
		}
		name := iface.Binding.Name
		var plugin *v1.InterfaceBindingPlugin
		if cfg.NetworkConfiguration != nil {
			if p, ok := cfg.NetworkConfiguration.Binding[name]; ok {
				plugin = &p
			}
		}
		switch {
		case plugin == nil:
			problems = append(problems, fmt.Sprintf("interface %s: binding %q is not registered in spec.configuration.network.binding", iface.Name, name))
		case plugin.SidecarImage == "":
			problems = append(problems, fmt.Sprintf("binding %q: sidecarImage is empty", name))
		}
	}
	return problems
}
