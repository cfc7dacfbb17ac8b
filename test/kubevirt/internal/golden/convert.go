package golden

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"

	v1 "kubevirt.io/api/core/v1"

	ephemeraldisk "kubevirt.io/kubevirt/pkg/ephemeral-disk"
	cmdv1 "kubevirt.io/kubevirt/pkg/handler-launcher-com/cmd/v1"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	archconverter "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	convertertypes "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/types"
)

// arch is fixed so the committed XML does not depend on the generating host.
const arch = "amd64"

// Domain converts the case's VMI the way virt-launcher's SyncVMI does on a
// fresh start: Convert_v1_VirtualMachineInstance_To_api_Domain with a
// converter context like the launcher's, then the launcher-side defaults.
// No SR-IOV, GPU or generic host devices are passed: a binding-plugin
// interface is not one KubeVirt turns into a hostdev itself.
func Domain(c Case) (*api.Domain, error) {
	return convert(c, true)
}

// DomainEmulated is Domain for a launcher without /dev/kvm under KubeVirt's
// useEmulation setting: the converter context's HypervisorDeviceAvailable is
// false and AllowEmulation true (as virt-handler passes it), so the
// converter makes a type="qemu" (TCG) domain.
func DomainEmulated(c Case) (*api.Domain, error) {
	return convert(c, false)
}

func convert(c Case, hypervisorDeviceAvailable bool) (*api.Domain, error) {
	vmi := c.VMI.DeepCopy()
	ctx := &convertertypes.ConverterContext{
		Architecture:                    archconverter.NewConverter(arch),
		VirtualMachine:                  vmi,
		AllowEmulation:                  true,
		HypervisorDeviceAvailable:       hypervisorDeviceAvailable,
		HostArchitecture:                arch,
		SMBios:                          &cmdv1.SMBios{},
		MemBalloonStatsPeriod:           10,
		FreePageReporting:               true,
		SerialConsoleLog:                true,
		DomainAttachmentByInterfaceName: c.DomainAttachment,
		DisksInfo:                       c.DisksInfo,
		// As virt-launcher makes it (--ephemeral-disk-dir default): the
		// converter asks it where a containerDisk's overlay lives.
		EphemeraldiskCreator: ephemeraldisk.NewEphemeralDiskCreator(filepath.Join("/var/run/kubevirt-ephemeral-disks", "disk-data")),
	}
	domain := &api.Domain{}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, domain, ctx); err != nil {
		return nil, fmt.Errorf("convert VMI %s with KubeVirt's converter: %w", vmi.Name, err)
	}
	api.NewDefaulter(arch).SetObjectDefaults_Domain(domain)
	return domain, nil
}

// MarshalDomainSpec renders a domain spec exactly as KubeVirt's hook manager
// does before it calls OnDefineDomain (pkg/hooks manager.go:
// xml.MarshalIndent(domainSpec, "", "\t")).
func MarshalDomainSpec(spec *api.DomainSpec) ([]byte, error) {
	out, err := xml.MarshalIndent(spec, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("marshal domain spec %s: %w", spec.Name, err)
	}
	return out, nil
}

// MarshalVMI renders the VMI as the hook manager sends it (json.Marshal).
func MarshalVMI(vmi *v1.VirtualMachineInstance) ([]byte, error) {
	out, err := json.Marshal(vmi)
	if err != nil {
		return nil, fmt.Errorf("marshal VMI %s: %w", vmi.Name, err)
	}
	return out, nil
}

// Files are the golden inputs of one case.
type Files struct {
	DomainXML []byte
	VMIJSON   []byte
}

// Generate produces the golden inputs of a case.
func Generate(c Case) (Files, error) {
	dom, err := Domain(c)
	if err != nil {
		return Files{}, err
	}
	x, err := MarshalDomainSpec(&dom.Spec)
	if err != nil {
		return Files{}, err
	}
	j, err := MarshalVMI(c.VMI)
	if err != nil {
		return Files{}, err
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, j, "", "  "); err != nil {
		return Files{}, fmt.Errorf("indent VMI %s: %w", c.VMI.Name, err)
	}
	indented.WriteByte('\n')
	return Files{DomainXML: append(x, '\n'), VMIJSON: indented.Bytes()}, nil
}

// DomainFile and VMIFile are the golden input paths of a case under dir.
func DomainFile(dir, name string) string { return filepath.Join(dir, name+".domain.xml") }

// VMIFile is the VMI JSON of a case under dir (indented; json.Compact gives
// the bytes the hook manager sends).
func VMIFile(dir, name string) string { return filepath.Join(dir, name+".vmi.json") }

// WriteAll regenerates every case's inputs into dir.
func WriteAll(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create golden dir: %w", err)
	}
	for _, c := range Cases() {
		f, err := Generate(c)
		if err != nil {
			return err
		}
		if err := os.WriteFile(DomainFile(dir, c.Name), f.DomainXML, 0o644); err != nil {
			return fmt.Errorf("write golden domain of %s: %w", c.Name, err)
		}
		if err := os.WriteFile(VMIFile(dir, c.Name), f.VMIJSON, 0o644); err != nil {
			return fmt.Errorf("write golden VMI of %s: %w", c.Name, err)
		}
	}
	return nil
}
