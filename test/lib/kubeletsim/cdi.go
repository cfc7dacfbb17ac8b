package kubeletsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiDevice is the part of a resolved CDI device a test looks at.
type cdiDevice struct {
	Mounts      []*cdispec.Mount
	DeviceNodes []string
	Env         []string
}

// resolveCDI finds the fully qualified CDI device id ("vendor/class=name")
// in the spec files of dirs, as a CDI-enabled runtime does, and returns the
// spec-wide plus device-specific container edits.
func resolveCDI(dirs []string, id string) (*cdiDevice, error) {
	kind, name, ok := strings.Cut(id, "=")
	if !ok || !strings.Contains(kind, "/") {
		return nil, fmt.Errorf("CDI device id %q is not vendor/class=name", id)
	}
	var found *cdiDevice
	var where string
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range files {
			if !strings.HasSuffix(f, ".json") && !strings.HasSuffix(f, ".yaml") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				continue // removed meanwhile
			}
			var spec cdispec.Spec
			if err := yaml.Unmarshal(data, &spec); err != nil {
				return nil, fmt.Errorf("CDI spec %s is invalid: %w", f, err)
			}
			if spec.Kind != kind {
				continue
			}
			for _, d := range spec.Devices {
				if d.Name != name {
					continue
				}
				if found != nil {
					return nil, fmt.Errorf("CDI device %s is defined twice: %s and %s", id, where, f)
				}
				found, where = &cdiDevice{}, f
				for _, e := range []cdispec.ContainerEdits{spec.ContainerEdits, d.ContainerEdits} {
					found.Mounts = append(found.Mounts, e.Mounts...)
					for _, n := range e.DeviceNodes {
						found.DeviceNodes = append(found.DeviceNodes, n.Path)
					}
					found.Env = append(found.Env, e.Env...)
				}
			}
		}
	}
	if found == nil {
		return nil, fmt.Errorf("CDI device %s not found in %v (the runtime would fail to create the container)", id, dirs)
	}
	return found, nil
}
