// Package xmlvalidate checks domain XML against libvirt's own RelaxNG schema
// with virt-xml-validate (Debian: libvirt-clients + libxml2-utils).
package xmlvalidate

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
)

// kubeVirtEmpties matches the empty SMBIOS elements KubeVirt v1.9.0's
// converter always writes under <sysinfo> (<bios/>, <baseBoard/>,
// <chassis/> with no entries); libvirt's schema requires at least one
// <entry> in each, so KubeVirt's own domains fail validation as generated.
var kubeVirtEmpties = regexp.MustCompile(`(?s)\s*<(bios|baseBoard|chassis)(\s*/>|>\s*</(bios|baseBoard|chassis)>)`)

// StripKubeVirtEmpties removes those empty elements. Tests apply it to the
// KubeVirt-made input and to the sidecar's output alike, so what is
// validated is everything else, including the sidecar's changes.
func StripKubeVirtEmpties(domainXML []byte) []byte {
	return kubeVirtEmpties.ReplaceAll(domainXML, nil)
}

// Available reports whether virt-xml-validate is installed.
func Available() error {
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		return fmt.Errorf("virt-xml-validate not found: install Debian packages libvirt-clients and libxml2-utils (make deps): %w", err)
	}
	return nil
}

// Domain validates domainXML with `virt-xml-validate FILE domain`.
func Domain(ctx context.Context, domainXML []byte) error {
	dir, err := os.MkdirTemp("", "vfxml")
	if err != nil {
		return fmt.Errorf("temp dir for virt-xml-validate: %w", err)
	}
	defer os.RemoveAll(dir)
	f := filepath.Join(dir, "domain.xml")
	if err := os.WriteFile(f, domainXML, 0o644); err != nil {
		return fmt.Errorf("write domain for virt-xml-validate: %w", err)
	}
	out, err := exec.CommandContext(ctx, "virt-xml-validate", f, "domain").CombinedOutput()
	if err != nil {
		return fmt.Errorf("virt-xml-validate: %w\n%s", err, out)
	}
	return nil
}
