package manifestcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

// TestProductManifests checks the product's manifests/kubevirt (the KubeVirt
// CR patch) and manifests/examples (the VM a user copies). It skips only
// while those directories do not exist; once they do, each must hold the
// objects it is meant to hold, so the test cannot pass on nothing.
func TestProductManifests(t *testing.T) {
	t.Parallel()
	root, err := product.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crDir := filepath.Join(root, "manifests", "kubevirt")
	exDir := filepath.Join(root, "manifests", "examples")
	crFiles, err := YAMLFiles(crDir)
	if err != nil {
		t.Fatal(err)
	}
	exFiles, err := YAMLFiles(exDir)
	if err != nil {
		t.Fatal(err)
	}

	cr, err := DecodeFiles(crFiles...)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.KubeVirts) != 1 {
		t.Fatalf("%s: want exactly one KubeVirt object (the CR patch), found %d in %v", crDir, len(cr.KubeVirts), crFiles)
	}
	kv := cr.KubeVirts[0]
	ex, err := DecodeFiles(exFiles...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.VMs) == 0 {
		t.Fatalf("%s: no VirtualMachine found in %v", exDir, exFiles)
	}

	cfg, added := ClusterConfig(kv.Obj, RequiredGates...)
	if len(added) > 0 {
		// The gates are cluster prerequisites the README names; the patch
		// need not carry them, but say what the admission ran with.
		t.Logf("%s does not enable %v; validating with them enabled, as the README requires", kv, added)
	}
	for _, vm := range ex.VMs {
		if causes := ValidateVM(vm.Obj, cfg); len(causes) > 0 {
			t.Errorf("%s: KubeVirt v1.9.0's VM admission rejects the example:\n%s", vm, formatCauses(causes))
		}
		if problems := BindingRegistration(&vm.Obj.Spec.Template.Spec, cfg); len(problems) > 0 {
			t.Errorf("%s against %s:\n%s", vm, kv, strings.Join(problems, "\n"))
		}
		if !usesDRABinding(&vm.Obj.Spec.Template.Spec) {
			t.Errorf("%s: no interface uses a binding plugin on a resourceClaim network; the example does not show vfnet", vm)
		}
	}
}

func usesDRABinding(spec *v1.VirtualMachineInstanceSpec) bool {
	for _, iface := range spec.Domain.Devices.Interfaces {
		for _, n := range spec.Networks {
			if iface.Binding != nil && n.Name == iface.Name && n.ResourceClaim != nil {
				return true
			}
		}
	}
	return false
}

func formatCauses(causes []metav1.StatusCause) string {
	var b strings.Builder
	for _, c := range causes {
		b.WriteString("  " + c.Field + ": " + c.Message + "\n")
	}
	return b.String()
}

func fixtures(t *testing.T) (*v1.KubeVirt, *v1.VirtualMachine) {
	t.Helper()
	objs, err := DecodeFiles("testdata/kubevirt-cr.yaml", "testdata/vm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.KubeVirts) != 1 || len(objs.VMs) != 1 {
		t.Fatalf("fixtures: %d KubeVirt, %d VM", len(objs.KubeVirts), len(objs.VMs))
	}
	return objs.KubeVirts[0].Obj, objs.VMs[0].Obj
}

// The tests below prove the checks have teeth on the checker's own
// fixtures, independent of the product's manifests.

func TestFixturesPass(t *testing.T) {
	t.Parallel()
	kv, vm := fixtures(t)
	cfg, added := ClusterConfig(kv, RequiredGates...)
	if len(added) != 0 {
		t.Errorf("fixture CR should enable every required gate, added %v", added)
	}
	if causes := ValidateVM(vm, cfg); len(causes) != 0 {
		t.Errorf("fixture VM rejected:\n%s", formatCauses(causes))
	}
	if p := BindingRegistration(&vm.Spec.Template.Spec, cfg); len(p) != 0 {
		t.Errorf("fixture binding registration: %v", p)
	}
}

func TestStrictDecodeRefusesUnknownField(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/vm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), "        resourceClaimTemplateName: vf-template",
		"        resourceClaimTemplateName: vf-template\n        resourceClaimTemplate: typo", 1)
	p := filepath.Join(t.TempDir(), "vm.yaml")
	if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = DecodeFiles(p)
	if err == nil || !strings.Contains(err.Error(), "resourceClaimTemplate") {
		t.Fatalf("unknown field not refused: %v", err)
	}
}

func TestStrictDecodeRefusesUnknownKubeVirtKind(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "x.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: kubevirt.io/v1\nkind: VirtualMachinePool\nmetadata: {name: x}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeFiles(p); err == nil {
		t.Fatal("an unchecked kubevirt.io kind passed silently")
	}
}

func TestAdmissionRejectsBrokenDRANetworks(t *testing.T) {
	t.Parallel()
	kv, vm := fixtures(t)
	cfg, _ := ClusterConfig(kv, RequiredGates...)
	for name, tc := range map[string]struct {
		mutate func(*v1.VirtualMachineInstanceSpec, *v1.KubeVirtConfiguration)
		want   string
	}{
		"claim not in resourceClaims": {
			mutate: func(s *v1.VirtualMachineInstanceSpec, _ *v1.KubeVirtConfiguration) {
				s.Networks[0].ResourceClaim.ClaimName = "missing"
			},
			want: "not defined in spec.resourceClaims",
		},
		"empty requestName": {
			mutate: func(s *v1.VirtualMachineInstanceSpec, _ *v1.KubeVirtConfiguration) {
				s.Networks[0].ResourceClaim.RequestName = ""
			},
			want: "requestName is required",
		},
		"gate off": {
			mutate: func(_ *v1.VirtualMachineInstanceSpec, c *v1.KubeVirtConfiguration) {
				c.DeveloperConfiguration.FeatureGates = []string{"ReservedOverheadMemlock"}
			},
			want: "NetworkDevicesWithDRA",
		},
		"DRA network on a masquerade interface": {
			mutate: func(s *v1.VirtualMachineInstanceSpec, _ *v1.KubeVirtConfiguration) {
				s.Domain.Devices.Interfaces[0].Binding = nil
				s.Domain.Devices.Interfaces[0].Masquerade = &v1.InterfaceMasquerade{}
			},
			want: "requires an SR-IOV or binding plugin interface",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			vm := vm.DeepCopy()
			cfg := cfg.DeepCopy()
			tc.mutate(&vm.Spec.Template.Spec, cfg)
			causes := ValidateVM(vm, cfg)
			if !strings.Contains(formatCauses(causes), tc.want) {
				t.Errorf("want a cause containing %q, got:\n%s", tc.want, formatCauses(causes))
			}
		})
	}
}

func TestBindingRegistrationProblems(t *testing.T) {
	t.Parallel()
	kv, vm := fixtures(t)
	cfg, _ := ClusterConfig(kv, RequiredGates...)
	noImage := cfg.DeepCopy()
	b := noImage.NetworkConfiguration.Binding["vfnet"]
	b.SidecarImage = ""
	noImage.NetworkConfiguration.Binding["vfnet"] = b
	if p := BindingRegistration(&vm.Spec.Template.Spec, noImage); len(p) != 1 || !strings.Contains(p[0], "sidecarImage") {
		t.Errorf("missing sidecar image not reported: %v", p)
	}
	if p := BindingRegistration(&vm.Spec.Template.Spec, cfg); len(p) != 0 {
		t.Errorf("the fixture's registration reported: %v", p)
	}
	unregistered := cfg.DeepCopy()
	delete(unregistered.NetworkConfiguration.Binding, "vfnet")
	if p := BindingRegistration(&vm.Spec.Template.Spec, unregistered); len(p) != 1 || !strings.Contains(p[0], "not registered") {
		t.Errorf("unregistered binding not reported: %v", p)
	}
}

// TestUnknownFieldBelowVMISpec: KubeVirt's VirtualMachineInstanceSpec
// decodes itself without strictness; an unknown key deep inside must still
// be refused.
func TestUnknownFieldBelowVMISpec(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/vm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), "            macAddress:", "            macAdress: x\n            macAddress:", 1)
	p := filepath.Join(t.TempDir(), "vm.yaml")
	if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = DecodeFiles(p)
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.domain.devices.interfaces[0].macAdress") {
		t.Fatalf("unknown nested field not refused with its path: %v", err)
	}
}
