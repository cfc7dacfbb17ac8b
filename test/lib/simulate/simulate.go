// Package simulate is vfnet-driver's --simulate: a host built by
// test/lib/simhost in place of the kernel. test/cmd/vfnet-driver-sim, the demo and the
// tests link it; the shipped cmd/vfnet-driver does not (its main passes no
// app.Simulator), so the images carry no simulator.
package simulate

import (
	"fmt"

	"github.com/vfnet-io/vfnet/driver"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// Open is an app.Simulator: it reopens the simulated host under sysfsRoot
// (its /dev at devRoot when not empty), with the simulated kernel as the
// sysfs writer and the simulated VF link layer on hostNetns.
func Open(sysfsRoot, devRoot, hostNetns string) (*driver.Host, error) {
	var opts []simhost.Option
	if devRoot != "" {
		opts = append(opts, simhost.WithDevRoot(devRoot))
	}
	h, err := simhost.Open(sysfsRoot, opts...)
	if err != nil {
		return nil, fmt.Errorf("--simulate: %w", err)
	}
	var links vflink.Links = h.Links()
	// The default names the host's namespace: in a simulation that is the
	// simulated host's own, so a manifest that spells it out still works.
	if hostNetns != vflink.DefaultHostNetns {
		l, err := h.LinksAt(hostNetns)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("--host-netns: %w", err)
		}
		links = l
	}
	return &driver.Host{Sysfs: h.Sysfs(), Writer: h.Kernel(), Links: links, DevRoot: h.DevRoot(), Events: h.EventSources, Close: func() { h.Close() }}, nil
}
