package flow

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// VFRef locates an allocated device on the simulated host, from the
// attributes the driver published for it.
type VFRef struct {
	Device  string
	BDF     string
	PFName  string
	VFIndex int
	Network string
}

// VFHostState is what the simulated host shows for one VF.
type VFHostState struct {
	Driver     string
	IOMMUGroup string
	Link       vflink.VFState
}

// Slices returns this driver's ResourceSlices of node, sorted by name.
func (e *Env) Slices(ctx context.Context, node string) ([]resourceapi.ResourceSlice, error) {
	list, err := e.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + DriverName + ",spec.nodeName=" + node,
	})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices of node %s: %w", node, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// WaitSlices waits until node's pool is complete (every slice of the newest
// generation is there) with want devices, and returns the devices' refs.
func (e *Env) WaitSlices(ctx context.Context, node string, want int, timeout time.Duration) ([]VFRef, error) {
	var refs []VFRef
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		slices, err := e.Slices(ctx, node)
		if err != nil {
			return false, err
		}
		gen, count := int64(-1), int64(0)
		for _, s := range slices {
			if s.Spec.Pool.Generation > gen {
				gen, count = s.Spec.Pool.Generation, s.Spec.Pool.ResourceSliceCount
			}
		}
		refs = refs[:0]
		n := int64(0)
		for _, s := range slices {
			if s.Spec.Pool.Generation != gen {
				continue
			}
			n++
			for _, d := range s.Spec.Devices {
				refs = append(refs, refOf(d))
			}
		}
		last = fmt.Sprintf("%d of %d slices, %d devices", n, count, len(refs))
		return n == count && count > 0 && len(refs) == want, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: wait for %d published devices: %w (last: %s)", node, want, err, last)
	}
	return refs, nil
}

func refOf(d resourceapi.Device) VFRef {
	r := VFRef{Device: d.Name}
	for name, a := range d.Attributes {
		switch {
		case strings.HasSuffix(string(name), "pciBusID") && a.StringValue != nil:
			r.BDF = *a.StringValue
		case name == "vfnet.io/pfName" && a.StringValue != nil:
			r.PFName = *a.StringValue
		case name == "vfnet.io/vfIndex" && a.IntValue != nil:
			r.VFIndex = int(*a.IntValue)
		case name == "vfnet.io/network" && a.StringValue != nil:
			r.Network = *a.StringValue
		}
	}
	return r
}

// Ref finds the published device name on node.
func (e *Env) Ref(ctx context.Context, node, device string) (VFRef, error) {
	slices, err := e.Slices(ctx, node)
	if err != nil {
		return VFRef{}, err
	}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return refOf(d), nil
			}
		}
	}
	return VFRef{}, fmt.Errorf("device %s is not published for node %s", device, node)
}

// SliceTable renders node's slices as a short table for people.
func (e *Env) SliceTable(ctx context.Context, node string) (string, error) {
	slices, err := e.Slices(ctx, node)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SLICE\tDEVICE\tPCI\tPF\tVF\tNETWORK")
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			r := refOf(d)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", s.Name, r.Device, r.BDF, r.PFName, r.VFIndex, r.Network)
		}
	}
	w.Flush()
	return b.String(), nil
}

// VFState reads the VF's driver, IOMMU group and link settings from the
// simulated host.
func (n *Node) VFState(ref VFRef) (VFHostState, error) {
	fn, err := n.Host.Sysfs().Function(ref.BDF)
	if err != nil {
		return VFHostState{}, fmt.Errorf("node %s: read VF %s from sysfs: %w", n.Name, ref.BDF, err)
	}
	link, err := n.Host.VFState(ref.PFName, ref.VFIndex)
	if err != nil {
		return VFHostState{}, fmt.Errorf("node %s: read VF %d of %s: %w", n.Name, ref.VFIndex, ref.PFName, err)
	}
	return VFHostState{Driver: fn.Driver, IOMMUGroup: fn.IOMMUGroup, Link: link}, nil
}
