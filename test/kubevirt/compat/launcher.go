package compat

import (
	"encoding/xml"
	"fmt"
	"os"
	"time"

	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
)

const roleLauncher = "launcher"

// hookSidecarDir is where virt-launcher finds the first hook sidecar's
// sockets: the sidecar's own subPath of the shared emptyDir.
const hookSidecarDir = hooks.HookSocketsSharedDirectory + "/hook-sidecar-0"

// runLauncher does what virt-launcher does with hook sidecars on a VMI
// start, using KubeVirt's own code and its hard-coded socket directory
// (bind-mounted by the caller in a private mount namespace): Collect (scan,
// dial, Info), then OnDefineDomain on the converter's domain, then the
// post-hook unmarshal of ApplySidecarHooks, then Shutdown after "QEMU exits".
// args: case name, output file for the final domain XML.
func runLauncher(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("want args: <case> <out.xml>, got %q", args)
	}
	var c *golden.Case
	for _, gc := range golden.Cases() {
		if gc.Name == args[0] {
			c = &gc
		}
	}
	if c == nil {
		return fmt.Errorf("no golden case %q", args[0])
	}
	dom, err := golden.Domain(*c)
	if err != nil {
		return err
	}
	mgr := hooks.GetManager()
	if err := mgr.Collect(1, time.Minute); err != nil {
		return fmt.Errorf("hook manager Collect: %w", err)
	}
	out, err := mgr.OnDefineDomain(&dom.Spec, c.VMI)
	if err != nil {
		return fmt.Errorf("hook manager OnDefineDomain: %w", err)
	}
	var spec api.DomainSpec
	if err := xml.Unmarshal([]byte(out), &spec); err != nil {
		return fmt.Errorf("unmarshal hook result into api.DomainSpec: %w", err)
	}
	if err := os.WriteFile(args[1], []byte(out), 0o644); err != nil {
		return err
	}
	if err := mgr.Shutdown(); err != nil {
		return fmt.Errorf("hook manager Shutdown: %w", err)
	}
	return nil
}
