package metadata

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// FileReader reads the metadata of VMI binding interfaces from the files the
// kubelet mounted under Root, and explains what is missing when it cannot.
type FileReader struct {
	// Root is the metadata mount point, DefaultRoot in a container.
	Root string
}

// Read returns the vfnet device that backs ci. Every error names the file.
func (r FileReader) Read(ci vmiview.ClaimInterface) (*Device, error) {
	path := PathFor(r.Root, ci)
	d, err := Read(path)
	if err == nil {
		return d, nil
	}
	return nil, r.explain(ci, path, err)
}

// explain turns a failure to read the metadata file at path into an error
// that says what to fix.
func (r FileReader) explain(ci vmiview.ClaimInterface, path string, err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w; the file must be readable by the sidecar's user (uid 107 for non-root VMs): check vfnet-driver's metadata file mode", err)
	}
	if !IsNotExist(err) {
		return err
	}
	return r.explainMissing(ci, path)
}

func (r FileReader) explainMissing(ci vmiview.ClaimInterface, path string) error {
	requestDir := filepath.Dir(path)
	claimDir := filepath.Dir(requestDir)
	if _, err := os.Stat(claimDir); err != nil {
		kind := "template claim " + ci.PodClaimName
		if ci.ResourceClaimName != nil {
			kind = "ResourceClaim " + *ci.ResourceClaimName
		}
		return fmt.Errorf("metadata file %s: directory %s does not exist, so no device metadata of %s is mounted into this container. "+
			"Two possible causes: KubeVirt gives binding sidecars the VM's claims only from v1.10 (kubevirt PR 18741): upgrade KubeVirt; "+
			"or the container runtime does not apply CDI, through which the kubelet mounts device metadata (and /dev/vfio nodes) into containers: "+
			"use containerd 2.x, or containerd 1.7 with enable_cdi = true in its CRI plugin configuration (CRI-O enables CDI by default). "+
			"If both are fine, check that the claim was allocated and prepared by vfnet-driver (kubectl describe resourceclaim)", path, claimDir, kind)
	}
	if _, err := os.Stat(requestDir); err != nil {
		return fmt.Errorf("metadata file %s: the claim is mounted but has no metadata for request %q; check spec.networks[].resourceClaim.requestName against the claim's requests", path, ci.RequestName)
	}
	others, _ := filepath.Glob(filepath.Join(requestDir, "*"+FileSuffix))
	if len(others) > 0 {
		names := make([]string, len(others))
		for i, o := range others {
			names[i] = strings.TrimSuffix(filepath.Base(o), FileSuffix)
		}
		return fmt.Errorf("metadata file %s does not exist; request %q was allocated by driver(s) %s, not %s: select a vfnet DeviceClass in the claim", path, ci.RequestName, strings.Join(names, ", "), DriverName)
	}
	return fmt.Errorf("metadata file %s does not exist; vfnet-driver did not write device metadata for request %q (see the vfnet-driver logs on the node)", path, ci.RequestName)
}
