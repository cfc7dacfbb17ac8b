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
	"strings"

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
	// Hook, if set, is called with StepTempWritten inside Write, once the
	// temporary file is complete and valid and before it is renamed into
	// place. Crash tests stop the process there.
	Hook func(step string)
}

// StepTempWritten is Write's Hook step: a kill there leaves the claim's
// temporary file behind (RemoveTemps removes it).
const StepTempWritten = "cdi-temp-written"

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
// atomically. It returns the CDI IDs, in the order of devices. Callers must
// not write one claim's spec concurrently (prepare holds the node lock).
func (w Writer) Write(claimUID types.UID, devices []Device) ([]string, error) {
	data, err := w.encode(claimUID, devices)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(w.Root, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory %s (--cdi-root): %w", w.Root, err)
	}
	// The temporary file is validated the way a runtime will read it and
	// then renamed into place, so what is validated is exactly what is
	// installed. Runtimes ignore its .tmp name.
	var invalid error
	err = checkpoint.WriteFileAtomicChecked(w.SpecPath(claimUID), data, 0o644, func(tmp string) error {
		if _, err := cdiapi.ReadSpec(tmp, 0); err != nil {
			invalid = fmt.Errorf("CDI spec for claim %s fails CDI validation: %w", claimUID, err)
			return invalid
		}
		if w.Hook != nil {
			w.Hook(StepTempWritten)
		}
		return nil
	})
	switch {
	case invalid != nil:
		return nil, invalid
	case err != nil:
		return nil, fmt.Errorf("write CDI spec for claim %s in %s (--cdi-root): %w", claimUID, w.Root, err)
	}
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = DeviceID(claimUID, d.Name)
	}
	return ids, nil
}

// validateName is the validation copy older drivers wrote before the spec
// (a kill could leave it too).
func validateName(spec string) string { return "." + spec + ".validate" }

// TempGlobs match the temporary files Write (or an older driver's Write)
// creates in Root for any claim; a crash in the middle of Write leaves them
// behind.
func (w Writer) TempGlobs() []string {
	name := cdiapi.GenerateTransientSpecName(Vendor, Class, "*") + ".json"
	root := checkpoint.GlobEscape(w.Root)
	return []string{filepath.Join(root, checkpoint.TempGlob(name)), filepath.Join(root, validateName(name))}
}

// RemoveTemps removes the temporary files of the claim's spec that an
// interrupted Write left in Root, and returns the ones it removed. Only
// files named after this claim's spec are touched. The caller must make sure
// no Write of the claim runs meanwhile (prepare holds the node lock).
func (w Writer) RemoveTemps(claimUID types.UID) ([]string, error) {
	spec := filepath.Base(w.SpecPath(claimUID))
	matches, err := filepath.Glob(filepath.Join(checkpoint.GlobEscape(w.Root), checkpoint.TempGlob(checkpoint.GlobEscape(spec))))
	if err != nil {
		return nil, fmt.Errorf("list temporary files of CDI spec %s: %w", spec, err)
	}
	// The glob's * also matches another claim whose UID extends this one
	// ("<uid>.json.x"); os.CreateTemp's random part is decimal digits.
	var names []string
	for _, m := range matches {
		if IsTempName(filepath.Base(m), spec) {
			names = append(names, m)
		}
	}
	names = append(names, filepath.Join(w.Root, validateName(spec)))
	var removed []string
	var errs []error
	for _, p := range names {
		switch err := os.Remove(p); {
		case err == nil:
			removed = append(removed, p)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("remove temporary CDI spec file %s: %w", p, err))
		}
	}
	return removed, errors.Join(errs...)
}

// IsTempName reports whether name is one of the temporary files
// checkpoint.WriteFileAtomic, Write and the kubeletplugin helper create to
// replace the file named file: "." + file + "." + decimal digits + ".tmp".
func IsTempName(name, file string) bool {
	rest, ok := strings.CutPrefix(name, "."+file+".")
	if !ok {
		return false
	}
	digits, ok := strings.CutSuffix(rest, ".tmp")
	if !ok || digits == "" {
		return false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
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
