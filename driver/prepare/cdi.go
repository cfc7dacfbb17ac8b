// CDI specs: each prepared claim gets one spec that gives the VM's container
// the VF's VFIO group node and the VFIO container node.

package prepare

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

// cdiVendor and cdiClass make the CDI kind "sriov.vfnet.io/vf".
const (
	cdiVendor = "sriov.vfnet.io"
	cdiClass  = "vf"
	cdiKind   = cdiVendor + "/" + cdiClass
)

// cdiDevice is one VF of a claim.
type cdiDevice struct {
	// Name is the DRA device name, e.g. "vf-0000-3b-02-1".
	Name string
	// DevNode is the group node relative to the dev root: "vfio/42" or
	// "vfio/noiommu-42".
	DevNode string
}

// CDIWriter writes specs to Root (the runtime's CDI directory). DevRoot is
// the host directory that holds vfio/ ("/dev" in production); container
// paths are always under /dev.
type CDIWriter struct {
	Root    string
	DevRoot string
	// Hook, if set, is called with StepCDITempWritten inside write, once the
	// temporary file is complete and valid and before it is renamed into
	// place. Crash tests stop the process there; a kill there leaves the
	// claim's temporary file behind (removeTemps removes it).
	Hook func(step string)
}

// cdiDeviceName is the CDI device name of one VF of one claim. The claim UID
// keeps names unique, so runtimes never hit a stale cached spec.
func cdiDeviceName(claimUID types.UID, device string) string {
	return string(claimUID) + "-" + device
}

// cdiDeviceID is the fully qualified CDI ID handed to the kubelet.
func cdiDeviceID(claimUID types.UID, device string) string {
	return cdiKind + "=" + cdiDeviceName(claimUID, device)
}

// SpecPath is the file holding the claim's spec.
func (w CDIWriter) SpecPath(claimUID types.UID) string {
	return filepath.Join(w.Root, cdiapi.GenerateTransientSpecName(cdiVendor, cdiClass, string(claimUID))+".json")
}

// build returns the spec for a claim's devices.
func (w CDIWriter) build(claimUID types.UID, devices []cdiDevice) *cdispec.Spec {
	spec := &cdispec.Spec{
		Kind: cdiKind,
		ContainerEdits: cdispec.ContainerEdits{
			DeviceNodes: []*cdispec.DeviceNode{{
				Path:     "/dev/vfio/vfio",
				HostPath: filepath.Join(w.DevRoot, "vfio", "vfio"),
			}},
		},
	}
	for _, d := range devices {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: cdiDeviceName(claimUID, d.Name),
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

// write validates the claim's spec with the CDI library and puts it in place
// atomically. It returns the CDI IDs, in the order of devices. Callers must
// not write one claim's spec concurrently (prepare holds the node lock).
func (w CDIWriter) write(claimUID types.UID, devices []cdiDevice) ([]string, error) {
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
			w.Hook(StepCDITempWritten)
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
		ids[i] = cdiDeviceID(claimUID, d.Name)
	}
	return ids, nil
}

// validateName is the validation copy older drivers wrote before the spec
// (a kill could leave it too).
func validateName(spec string) string { return "." + spec + ".validate" }

// tempGlobs match the temporary files write (or an older driver's write)
// creates in Root for any claim; a crash in the middle of write leaves them
// behind.
func (w CDIWriter) tempGlobs() []string {
	name := cdiapi.GenerateTransientSpecName(cdiVendor, cdiClass, "*") + ".json"
	root := checkpoint.GlobEscape(w.Root)
	return []string{filepath.Join(root, checkpoint.TempGlob(name)), filepath.Join(root, validateName(name))}
}

// removeTemps removes the temporary files of the claim's spec that an
// interrupted write left in Root, and returns the ones it removed. Only
// files named after this claim's spec are touched. The caller must make sure
// no write of the claim runs meanwhile (prepare holds the node lock).
func (w CDIWriter) removeTemps(claimUID types.UID) ([]string, error) {
	spec := filepath.Base(w.SpecPath(claimUID))
	matches, err := filepath.Glob(filepath.Join(checkpoint.GlobEscape(w.Root), checkpoint.TempGlob(checkpoint.GlobEscape(spec))))
	if err != nil {
		return nil, fmt.Errorf("list temporary files of CDI spec %s: %w", spec, err)
	}
	// The glob's * also matches another claim whose UID extends this one
	// ("<uid>.json.x"); os.CreateTemp's random part is decimal digits.
	var names []string
	for _, m := range matches {
		if isTempName(filepath.Base(m), spec) {
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

// isTempName reports whether name is one of the temporary files
// checkpoint.WriteFileAtomic, CDIWriter.write and the kubeletplugin helper
// create to replace the file named file: "." + file + "." + decimal digits +
// ".tmp".
func isTempName(name, file string) bool {
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

func (w CDIWriter) encode(claimUID types.UID, devices []cdiDevice) ([]byte, error) {
	if len(devices) == 0 {
		return nil, fmt.Errorf("CDI spec for claim %s: no devices", claimUID)
	}
	spec := w.build(claimUID, devices)
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

// installed reports whether the claim's spec file holds exactly what write
// would write for devices (false when it is missing, e.g. after a reboot
// emptied the tmpfs CDI directory).
func (w CDIWriter) installed(claimUID types.UID, devices []cdiDevice) (bool, error) {
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

// remove deletes the claim's spec; a missing spec is not an error.
func (w CDIWriter) remove(claimUID types.UID) error {
	p := w.SpecPath(claimUID)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec %s: %w", p, err)
	}
	return nil
}
