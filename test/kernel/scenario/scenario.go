// Package scenario is one sequence of kernel operations on an igb (82576)
// VF that runs both on the real kernel (the real-kernel tier's "trace"
// case) and on test/lib/simhost (TestSimhostFollowsKernelTrace), recording what
// a driver can observe after each step. Both are compared with
// kernel-trace.json, recorded from the real kernel: where the simulation
// and the kernel disagree, the simulation is wrong.
package scenario

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/pcibind"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// KernelTrace is the trace recorded on Linux 6.1 (Debian) with QEMU 10's
// igb: what every implementation must reproduce.
//
//go:embed kernel-trace.json
var kernelTrace []byte

// KernelTrace returns the recorded real-kernel trace.
func KernelTrace() (Trace, error) {
	var t Trace
	if err := json.Unmarshal(kernelTrace, &t); err != nil {
		return nil, fmt.Errorf("scenario/kernel-trace.json: %w", err)
	}
	return t, nil
}

// Host is where the scenario runs: the VF with index VF of the igb PF at
// PFAddress, whose VF driver is VFDriver.
type Host struct {
	Sysfs     *sysfs.Host
	Writer    sysfs.Writer
	Links     vflink.Links
	DevRoot   string
	PFAddress string
	VF        int
}

// Step is what a driver observes after one step.
type Step struct {
	Name string `json:"name"`
	// Errno of the step's kernel call ("" when it succeeded).
	Errno    string `json:"errno,omitempty"`
	Driver   string `json:"driver"`
	Override string `json:"override"`
	// MAC as the PF reports it: "zero", "set" (the one the scenario set
	// through the PF) or "own" (another: one the VF driver chose itself).
	MAC       string `json:"mac"`
	VLAN      int    `json:"vlan"`
	QoS       int    `json:"qos"`
	VLANProto string `json:"vlanProto"`
	SpoofChk  bool   `json:"spoofChk"`
	Trust     bool   `json:"trust"`
	LinkState string `json:"linkState"`
	MinTx     int    `json:"minTxRateMbps"`
	MaxTx     int    `json:"maxTxRateMbps"`
	// GroupNode: /dev/vfio/<group> exists.
	GroupNode bool `json:"groupNode"`
}

// Trace is the steps in order.
type Trace []Step

// setMAC is the MAC the scenario sets through the PF.
var setMAC = net.HardwareAddr{0x02, 0, 0, 0x0a, 0x0b, 0x0c}

func errnoOf(err error) string {
	if err == nil {
		return ""
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return "error: " + err.Error()
}

// Run runs the scenario. The VF must start on its VF driver with nothing
// set through the PF, and ends that way when every step works.
func Run(ctx context.Context, h Host) (Trace, error) {
	pfFn, err := h.Sysfs.Function(h.PFAddress)
	if err != nil {
		return nil, err
	}
	if len(pfFn.NetDevs) == 0 {
		return nil, fmt.Errorf("PF %s has no netdev", h.PFAddress)
	}
	pf := pfFn.NetDevs[0]
	pfDev := "bus/pci/devices/" + h.PFAddress + "/"
	vfPath, err := os.Readlink(h.Sysfs.Path(pfDev + fmt.Sprintf("virtfn%d", h.VF)))
	if err != nil {
		return nil, err
	}
	bdf := vfPath[strings.LastIndex(vfPath, "/")+1:]
	first, err := h.Sysfs.Function(bdf)
	if err != nil {
		return nil, err
	}
	vfDriver := first.Driver
	b := pcibind.Binder{Sysfs: h.Sysfs, Writer: h.Writer, DevRoot: h.DevRoot, NodeName: "scenario"}

	var trace Trace
	observe := func(name string, stepErr error) error {
		fn, err := h.Sysfs.Function(bdf)
		if err != nil {
			return err
		}
		st, err := h.Links.VF(pf, h.VF)
		if err != nil {
			return err
		}
		s := Step{Name: name, Errno: errnoOf(stepErr), Driver: fn.Driver, Override: fn.DriverOverride,
			VLAN: st.VLAN, QoS: st.QoS, VLANProto: st.VLANProto, SpoofChk: st.SpoofChk, Trust: st.Trust,
			LinkState: st.LinkState, MinTx: st.MinTxRateMbps, MaxTx: st.MaxTxRateMbps}
		switch {
		case bytes.Equal(st.MAC, make(net.HardwareAddr, 6)):
			s.MAC = "zero"
		case bytes.Equal(st.MAC, setMAC):
			s.MAC = "set"
		default:
			s.MAC = "own"
		}
		if fn.IOMMUGroup != "" {
			node, err := h.Sysfs.VFIOGroupDevice(fn.IOMMUGroup)
			if err == nil {
				_, err = os.Stat(h.DevRoot + "/vfio/" + node)
				s.GroupNode = err == nil
			}
		}
		trace = append(trace, s)
		return nil
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"initial", func() error { return nil }},
		{"refused-vlan-802.1ad", func() error { return h.Links.SetVLAN(pf, h.VF, 10, 0, vflink.VLANProto8021AD) }},
		{"refused-link-state", func() error { return h.Links.SetLinkState(pf, h.VF, vflink.LinkStateDisable) }},
		{"refused-min-rate", func() error { return h.Links.SetRate(pf, h.VF, 10, 100) }},
		{"vlan-qos-without-vlan", func() error { return h.Links.SetVLAN(pf, h.VF, 0, 3, vflink.VLANProto8021Q) }},
		{"set-accepted", func() error {
			return errors.Join(h.Links.SetMAC(pf, h.VF, setMAC), h.Links.SetVLAN(pf, h.VF, 100, 3, vflink.VLANProto8021Q),
				h.Links.SetSpoofChk(pf, h.VF, false), h.Links.SetTrust(pf, h.VF, true), h.Links.SetRate(pf, h.VF, 0, 200))
		}},
		{"bind-vfio", func() error { _, err := b.BindVFIO(ctx, bdf, 30*time.Second); return err }},
		{"clear-settings", func() error {
			return errors.Join(h.Links.SetMAC(pf, h.VF, make(net.HardwareAddr, 6)), h.Links.SetVLAN(pf, h.VF, 0, 0, vflink.VLANProto8021Q),
				h.Links.SetSpoofChk(pf, h.VF, true), h.Links.SetTrust(pf, h.VF, false), h.Links.SetRate(pf, h.VF, 0, 0))
		}},
		{"restore-driver", func() error { return b.Restore(ctx, bdf, vfDriver, "") }},
		{"autoprobe-off-unbind", func() error {
			return errors.Join(h.Writer.WriteFile(pfDev+"sriov_drivers_autoprobe", []byte("0")),
				h.Writer.WriteFile("bus/pci/drivers/"+vfDriver+"/unbind", []byte(bdf)))
		}},
		{"bind-without-override", func() error { return h.Writer.WriteFile("bus/pci/drivers/"+vfDriver+"/bind", []byte(bdf)) }},
		// With no administrative MAC: does vfio-pci's bind make the PF
		// forget the MAC the VF driver chose?
		{"bind-vfio-unset-mac", func() error { _, err := b.BindVFIO(ctx, bdf, 30*time.Second); return err }},
		{"bind-through-override", func() error {
			err := b.Restore(ctx, bdf, vfDriver, "")
			return errors.Join(err, h.Writer.WriteFile(pfDev+"sriov_drivers_autoprobe", []byte("1")))
		}},
	}
	for _, s := range steps {
		if err := observe(s.name, s.do()); err != nil {
			return trace, fmt.Errorf("observe after %s: %w", s.name, err)
		}
	}
	return trace, nil
}

// Diff describes where got differs from want, "" when they agree.
func Diff(got, want Trace) string {
	var b strings.Builder
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w Step
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			fmt.Fprintf(&b, "step %d:\n  got  %s\n  want %s\n", i, gj, wj)
		}
	}
	return b.String()
}
