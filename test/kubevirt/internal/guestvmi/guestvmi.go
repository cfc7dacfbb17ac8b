// Package guestvmi is the file that carries a VMI rendered on the host (by
// cmd/vmirender) to cmd/kernellauncher in the real-kernel test guest.
//
// It exists so the launcher does not link virt-api: rendering the VMI runs
// virt-api's mutators, whose package initializers build KubeVirt's OpenAPI
// definitions (about 4 s and 950 MB of allocations natively, minutes under
// the guest's nested TCG). This package depends on kubevirt.io/api only.
package guestvmi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	v1 "kubevirt.io/api/core/v1"
)

// File is what the host hands the guest.
type File struct {
	// VMI is the VMI virt-controller and virt-api would produce from the
	// example VM, after the changes below.
	VMI *v1.VirtualMachineInstance `json:"vmi"`
	// Changes names each difference from the example VM and why the guest
	// needs it, as "<what> (<why>)".
	Changes []string `json:"changes"`
}

// Write writes f as JSON to path.
func Write(path string, f File) error {
	if f.VMI == nil {
		return errors.New("no VMI to write")
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the rendered VMI: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the rendered VMI: %w", err)
	}
	return nil
}

// Read reads a File written by Write.
func Read(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("read the rendered VMI: %w (render it on the host with test/kubevirt's cmd/vmirender)", err)
	}
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return File{}, fmt.Errorf("decode the rendered VMI %s: %w", path, err)
	}
	if f.VMI == nil {
		return File{}, fmt.Errorf("%s has no \"vmi\": render it with test/kubevirt's cmd/vmirender", path)
	}
	return f, nil
}
