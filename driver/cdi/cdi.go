// Package cdi writes the per-claim CDI spec that gives the VM's container the
// VF's VFIO group node and the VFIO container node.
package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
)

// Vendor and Class make the CDI kind "sriov.vfnet.io/vf".
const (
	Vendor = "sriov.vfnet.io"
	Class  = "vf"
	Kind   = Vendor + "/" + Class
)

// Device is one VF of a claim.
type Device struct {
	// Name is the DRA device name, e.g. "vf-0000-3b-02-1".
	Name string
	// DevNode is the group node relative to the dev root: "vfio/42" or
	// "vfio/noiommu-42".
	DevNode string
}

// Writer writes specs to Root (the runtime's CDI directory). DevRoot is the
// host directory that holds vfio/ ("/dev" in production); container paths
// are always under /dev.
type Writer struct {
	Root    string
	DevRoot string
}

// DeviceName is the CDI device name of one VF of one claim. The claim UID
// keeps names unique, so runtimes never hit a stale cached spec.
func DeviceName(claimUID types.UID, device string) string {
	return string(claimUID) + "-" + device
}

// DeviceID is the fully qualified CDI ID handed to the kubelet.
func DeviceID(claimUID types.UID, device string) string {
	return Kind + "=" + DeviceName(claimUID, device)
}

// SpecPath is the file holding the claim's spec.
func (w Writer) SpecPath(claimUID types.UID) string {
	return filepath.Join(w.Root, cdiapi.GenerateTransientSpecName(Vendor, Class, string(claimUID))+".json")
}

// Build returns the spec for a claim's devices.
func (w Writer) Build(claimUID types.UID, devices []Device) *cdispec.Spec {
	spec := &cdispec.Spec{
		Kind: Kind,
		ContainerEdits: cdispec.ContainerEdits{
			DeviceNodes: []*cdispec.DeviceNode{{
				Path:     "/dev/vfio/vfio",
				HostPath: filepath.Join(w.DevRoot, "vfio", "vfio"),
			}},
		},
	}
	for _, d := range devices {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: DeviceName(claimUID, d.Name),
			ContainerEdits: cdispec.ContainerEdits{
				DeviceNodes: []*cdispec.DeviceNode{{
					Path:     path.Join("/dev", d.DevNode),
					HostPath: filepath.Join(w.DevRoot, filepath.FromSlash(d.DevNode)),
				}},
			},
		})
	}
	return spec
}

// Write validates the claim's spec with the CDI library and puts it in place
// atomically. It returns the CDI IDs, in the order of devices.
func (w Writer) Write(claimUID types.UID, devices []Device) ([]string, error) {
	data, err := w.encode(claimUID, devices)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(w.Root, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory %s (--cdi-root): %w", w.Root, err)
	}
	final := w.SpecPath(claimUID)
	// Validate exactly the bytes we are about to install, the way a runtime
	// will read them, before they become visible under a .json name.
	tmp := filepath.Join(w.Root, validateName(filepath.Base(final)))
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return nil, fmt.Errorf("write CDI spec %s: %w", tmp, err)
	}
	_, verr := cdiapi.ReadSpec(tmp, 0)
	_ = os.Remove(tmp)
	if verr != nil {
		return nil, fmt.Errorf("CDI spec for claim %s fails CDI validation: %w", claimUID, verr)
	}
	if err := checkpoint.WriteFileAtomic(final, data, 0o644); err != nil {
		return nil, fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = DeviceID(claimUID, d.Name)
	}
	return ids, nil
}

func validateName(spec string) string { return "." + spec + ".validate" }

// TempGlobs match the temporary files Write creates in Root; a crash in the
// middle of Write leaves them behind.
func (w Writer) TempGlobs() []string {
	name := cdiapi.GenerateTransientSpecName(Vendor, Class, "*") + ".json"
	root := checkpoint.GlobEscape(w.Root)
	return []string{filepath.Join(root, checkpoint.TempGlob(name)), filepath.Join(root, validateName(name))}
}

func (w Writer) encode(claimUID types.UID, devices []Device) ([]byte, error) {
	if len(devices) == 0 {
		return nil, fmt.Errorf("CDI spec for claim %s: no devices", claimUID)
	}
	spec := w.Build(claimUID, devices)
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec for claim %s: determine version: %w", claimUID, err)
	}
	spec.Version = version
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec for claim %s: encode: %w", claimUID, err)
	}
	return data, nil
}

// Installed reports whether the claim's spec file holds exactly what Write
// would write for devices (false when it is missing, e.g. after a reboot
// emptied the tmpfs CDI directory).
func (w Writer) Installed(claimUID types.UID, devices []Device) (bool, error) {
	want, err := w.encode(claimUID, devices)
	if err != nil {
		return false, err
	}
	got, err := os.ReadFile(w.SpecPath(claimUID))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read CDI spec: %w", err)
	}
	return bytes.Equal(got, want), nil
}

// Remove deletes the claim's spec; a missing spec is not an error.
func (w Writer) Remove(claimUID types.UID) error {
	p := w.SpecPath(claimUID)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec %s: %w", p, err)
	}
	return nil
}
