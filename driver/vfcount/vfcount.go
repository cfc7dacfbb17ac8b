// Package vfcount brings a PF to the VF count its node configuration entry
// asks for (numVFs), the way the kernel allows and without pulling a VF from
// under a claim.
//
// The kernel's sriov_numvfs only goes from 0 to N or from N to 0 (writing N
// over another non-zero count is EBUSY), so every change of a PF that has
// VFs destroys all of them, even those whose index survives. vfnet therefore
// changes a PF's count only while none of its VFs is prepared (the
// checkpoint) or allocated to a ResourceClaim, and first publishes all of
// them with a NoSchedule taint (TaintKey) so the scheduler stops placing new
// claims there; the caller reads the slices back, and the change is made
// only once the API server shows the taint (Plan.AwaitingTaints). A
// blocked change is reported (log, Node Event, inspect) with the claims in
// the way and applied once they are gone.
//
// The desired count lives only in the configuration, so a crash between
// the two writes (0 written, N not yet) converges: the restarted driver
// sees 0 VFs and writes N.
package vfcount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// TaintKey marks the VFs a pending VF count change will destroy; the value
// is TaintRemoving (index >= the new count: gone for good) or
// TaintRecreating (index below it: destroyed and made anew, since the
// kernel goes through 0).
const TaintKey = "vfnet.io/vf-count-change"

// Taint values.
const (
	TaintRemoving   = "removing"
	TaintRecreating = "recreating"
)

// Event reasons on the Node.
const (
	ReasonBlocked = "VFNetVFCountBlocked"
	ReasonRefused = "VFNetVFCountRefused"
	ReasonChanged = "VFNetVFCountChanged"
	ReasonFailed  = "VFNetVFCountFailed"
)

// State is what vfnet does about one PF's VF count.
type State string

const (
	// InSync: the PF has the configured count.
	InSync State = "in-sync"
	// Pending: the change is allowed and is applied next.
	Pending State = "pending"
	// Blocked: VFs of the PF are in use; applied once they are not.
	Blocked State = "blocked"
	// Refused: the change cannot be made (see Reason); nothing is changed.
	Refused State = "refused"
)

// Blocker is a VF in use by a claim.
type Blocker struct {
	VF    string // PCI address
	Index int
	Claim string // namespace/name
	// Holder names the process holding the VF's vfio group open when no
	// claim of ours has it.
	Holder string
	// How: "prepared" (in vfnet's checkpoint), "allocated" (the claim's
	// allocation names the device) or "held open".
	How string
}

func (b Blocker) String() string {
	if b.Holder != "" {
		return fmt.Sprintf("VF %d (%s) is on vfio-pci and in use: %s", b.Index, b.VF, b.Holder)
	}
	return fmt.Sprintf("VF %d (%s) %s for claim %s", b.Index, b.VF, b.How, b.Claim)
}

// Plan is the outcome for one PF whose configuration sets numVFs.
type Plan struct {
	PF     string // PCI address
	PFName string // uplink netdev, "" if none
	// Field names the setting: "<file>: pfs[i].numVFs".
	Field                   string
	Current, Desired, Total int
	State                   State
	// Reason says why a change is refused or blocked, and what to do.
	Reason   string
	Blockers []Blocker
	// VFs are the PF's VFs now (index -> address), to taint.
	VFs map[int]string
	// AwaitingTaints, set by the caller between Plan and Apply, says why
	// the API server is not known to hold this PF's taints yet: Apply then
	// leaves the change for a later pass. Publishing only hands the slices
	// to an asynchronous controller, so the caller reads them back first.
	AwaitingTaints string
}

// Changing reports whether vfnet will change the PF's VFs (now or once
// unblocked): its VFs are then tainted.
func (p Plan) Changing() bool { return p.State == Pending || p.State == Blocked }

// String is one line for logs and inspect.
func (p Plan) String() string {
	pf := p.PF
	if p.PFName != "" {
		pf += " (" + p.PFName + ")"
	}
	switch p.State {
	case InSync:
		return fmt.Sprintf("PF %s has %d VFs as %s asks", pf, p.Current, p.Field)
	case Pending:
		return fmt.Sprintf("PF %s: %s", pf, p.steps())
	case Blocked:
		return fmt.Sprintf("PF %s: waiting to %s: %s", pf, p.steps(), p.Reason)
	default:
		return fmt.Sprintf("PF %s: not changing its VFs: %s", pf, p.Reason)
	}
}

func (p Plan) steps() string {
	switch {
	case p.Current == 0:
		return fmt.Sprintf("create %d VFs (%s; sriov_numvfs 0 -> %d)", p.Desired, p.Field, p.Desired)
	case p.Desired == 0:
		return fmt.Sprintf("remove its %d VFs (%s; sriov_numvfs %d -> 0)", p.Current, p.Field, p.Current)
	default:
		return fmt.Sprintf("replace its %d VFs by %d (%s; sriov_numvfs %d -> 0 -> %d, every VF is destroyed)", p.Current, p.Desired, p.Field, p.Current, p.Desired)
	}
}

// Usage says which VFs claims use.
type Usage struct {
	// Prepared maps VF PCI addresses in vfnet's checkpoint to their claim.
	Prepared map[string]string
	// Allocated maps device names of this node's pool allocated to a claim
	// to the claim; nil when not known (inspect has no cluster).
	Allocated map[string]string
	// Held maps VF addresses on vfio-pci whose /dev/vfio group node a
	// process holds open (a VM vfnet did not prepare) to the holders.
	// Removing such a VF would block the sriov_numvfs write in the kernel
	// until the process lets go.
	Held map[string]string
	// Unlisted is why Allocated is unknown (listing the claims failed):
	// any claim may hold any VF, so every change of a PF with VFs waits.
	Unlisted error
}

// Plans says, without changing anything, what vfnet does for every PF a
// numVFs selector of cfg matches. A numVFs selector naming a PCI device or
// netdev without SR-IOV is refused; one matching nothing on this node is
// not reported (the same file serves every node).
func Plans(cfg *nodeconfig.Config, pfs []sysfs.PF, host *sysfs.Host, use Usage) []Plan {
	if cfg == nil {
		return nil
	}
	var out []Plan
	matched := map[int]bool{}
	for i := range pfs {
		pf := &pfs[i]
		for j, sel := range cfg.PFs {
			if sel.NumVFs == nil || !sel.Matches(pf) {
				continue
			}
			matched[j] = true
			out = append(out, plan(pf, *sel.NumVFs, fmt.Sprintf("%s: pfs[%d].numVFs", cfg.Source, j), use))
			break // a PF matched twice is discovery's error
		}
	}
	for j, sel := range cfg.PFs {
		if sel.NumVFs == nil || matched[j] || host == nil {
			continue
		}
		if p, ok := notSRIOV(host, sel, *sel.NumVFs, fmt.Sprintf("%s: pfs[%d].numVFs", cfg.Source, j)); ok {
			out = append(out, p)
		}
	}
	return out
}

func plan(pf *sysfs.PF, want int, field string, use Usage) Plan {
	p := Plan{PF: pf.Address, PFName: pf.Uplink(), Field: field, Current: pf.NumVFs, Desired: want, Total: pf.TotalVFs, VFs: map[int]string{}}
	for _, vf := range pf.VFs {
		p.VFs[vf.Index] = vf.Address
	}
	switch {
	case want == pf.NumVFs:
		p.State = InSync
	case want > pf.TotalVFs:
		p.State = Refused
		p.Reason = fmt.Sprintf("%s is %d, above the PF's sriov_totalvfs %d: set it to at most %d", field, want, pf.TotalVFs, pf.TotalVFs)
	case pf.Switchdev:
		p.State = Refused
		p.Reason = fmt.Sprintf("%s is %d, but the PF's e-switch is in switchdev mode (VF representors %s), where VFs belong to the switchdev tooling: set legacy mode (devlink dev eswitch set pci/%s mode legacy) or drop numVFs",
			field, want, strings.Join(pf.Representors, ","), pf.Address)
	case pf.Driver == "":
		p.State = Refused
		p.Reason = fmt.Sprintf("%s is %d, but no driver is bound to the PF, and only its driver creates VFs: load the PF's driver", field, want)
	default:
		p.Blockers = blockers(pf, use)
		var why []string
		if len(p.Blockers) > 0 {
			var parts []string
			for _, b := range p.Blockers {
				parts = append(parts, b.String())
			}
			why = append(why, fmt.Sprintf("VFs in use: %s (the kernel destroys every VF of the PF on a change; it is made once these claims are unprepared and deallocated, and no process holds a VF open)", strings.Join(parts, "; ")))
		}
		if use.Unlisted != nil && len(pf.VFs) > 0 {
			why = append(why, fmt.Sprintf("ResourceClaims cannot be listed, so whether a claim is allocated one of its VFs is unknown (%v); the change is made once they can be listed", use.Unlisted))
		}
		if len(why) == 0 {
			p.State = Pending
			break
		}
		p.State = Blocked
		p.Reason = strings.Join(why, "; and ")
	}
	return p
}

func blockers(pf *sysfs.PF, use Usage) []Blocker {
	var out []Blocker
	for _, vf := range pf.VFs {
		if c, ok := use.Prepared[vf.Address]; ok {
			out = append(out, Blocker{VF: vf.Address, Index: vf.Index, Claim: c, How: "prepared"})
			continue
		}
		name, err := pciaddr.DeviceName(vf.Address)
		if err != nil {
			continue
		}
		if c, ok := use.Allocated[name]; ok {
			out = append(out, Blocker{VF: vf.Address, Index: vf.Index, Claim: c, How: "allocated"})
			continue
		}
		if h, ok := use.Held[vf.Address]; ok {
			out = append(out, Blocker{VF: vf.Address, Index: vf.Index, Holder: h, How: "held open"})
		}
	}
	return out
}

// HeldVFs asks holders who holds the group nodes of the VFs on vfio-pci
// (Usage.Held).
func HeldVFs(vfs []sysfs.VF, holders func([]string) (map[string][]string, error)) (map[string]string, error) {
	if holders == nil {
		return nil, nil
	}
	nodeOf := map[string]string{}
	var nodes []string
	for _, vf := range vfs {
		if n := discovery.GroupNode(vf.Function); vf.Driver == discovery.VFIODriver && n != "" {
			nodeOf[vf.Address] = n
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return nil, nil
	}
	got, err := holders(nodes)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for addr, n := range nodeOf {
		if hs := got[n]; len(hs) > 0 {
			out[addr] = fmt.Sprintf("/dev/vfio/%s held open by %s", n, strings.Join(hs, ", "))
		}
	}
	return out, nil
}

// notSRIOV finds the PCI device a numVFs selector names by address or
// netdev when it is not an SR-IOV PF.
func notSRIOV(host *sysfs.Host, sel nodeconfig.Selector, want int, field string) (Plan, bool) {
	bdf, name := sel.PCIAddress, sel.PFName
	if bdf == "" && name != "" {
		t, err := os.Readlink(host.Path(sysfs.ClassNetDir + "/" + name + "/device"))
		if err != nil {
			return Plan{}, false
		}
		bdf = filepath.Base(t)
	}
	if _, err := pciaddr.ParseKernelName(bdf); err != nil {
		return Plan{}, false
	}
	dir := host.Path(sysfs.PCIDevicesDir + "/" + bdf)
	if _, err := os.Stat(dir); err != nil {
		return Plan{}, false
	}
	var why string
	v, err := os.ReadFile(filepath.Join(dir, "sriov_totalvfs"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		why = "has no SR-IOV capability (no sriov_totalvfs)"
	case err != nil:
		why = "has an unreadable sriov_totalvfs (" + err.Error() + ")"
	case strings.TrimSpace(string(v)) == "0":
		why = "reports sriov_totalvfs 0 (SR-IOV disabled in its firmware or BIOS)"
	default:
		return Plan{}, false // an SR-IOV PF discovery skipped: it says why
	}
	return Plan{PF: bdf, PFName: name, Field: field, Desired: want, State: Refused,
		Reason: fmt.Sprintf("%s is %d, but PCI device %s %s: no VF can be created on it; name an SR-IOV PF or drop numVFs", field, want, bdf, why)}, true
}

// Taints returns, for every VF of a PF whose count will change, its taint
// value by device name.
func Taints(plans []Plan) map[string]string {
	out := map[string]string{}
	for _, p := range plans {
		if !p.Changing() {
			continue
		}
		for idx, addr := range p.VFs {
			name, err := pciaddr.DeviceName(addr)
			if err != nil {
				continue
			}
			out[name] = TaintRecreating
			if idx >= p.Desired {
				out[name] = TaintRemoving
			}
		}
	}
	return out
}

// Options are a Reconciler's dependencies.
type Options struct {
	NodeName string
	Sysfs    *sysfs.Host
	Writer   sysfs.Writer
	// Prepared reads the VFs vfnet's checkpoint holds (address -> claim),
	// for planning; it may be stale.
	Prepared func() map[string]string
	// Exclusive runs fn with the VFs prepared now, while no prepare or
	// unprepare runs (the node lock): no claim can take a VF between the
	// check and the writes.
	Exclusive func(ctx context.Context, fn func(prepared map[string]string) error) error
	// Allocated lists this node's devices allocated to claims (device name
	// -> claim); nil: not checked. It must return in bounded time (Apply
	// calls it under the node lock every prepare waits for), and its error
	// is shown as the reason a change waits, so it should name the fix.
	Allocated func(ctx context.Context) (map[string]string, error)
	// Holders says who holds /dev/vfio group nodes open (nil: not checked).
	Holders func(nodes []string) (map[string][]string, error)
	// Events records on the Node; nil records none.
	Events record.EventRecorder
}

// Reconciler applies the configured VF counts. Plan, then publish the
// taints of its result, then Apply; one goroutine (the rescan loop).
type Reconciler struct {
	opts Options
	mu   sync.Mutex
	// tainted: PF -> desired count whose taints an earlier pass published.
	tainted map[string]int
	// said: PF -> the last state line logged, so a state is reported once.
	said    map[string]string
	waiting bool
	// listErr is the last error listing the claims, logged once.
	listErr string
}

// New returns a Reconciler.
func New(opts Options) *Reconciler {
	return &Reconciler{opts: opts, tainted: map[string]int{}, said: map[string]string{}}
}

// Plan computes the plans for cfg and pfs with the current usage and
// reports each PF whose state changed (log line, Node Event).
func (r *Reconciler) Plan(ctx context.Context, cfg *nodeconfig.Config, pfs []sysfs.PF) []Plan {
	logger := klog.FromContext(ctx)
	var use Usage
	needUse := false
	for _, p := range Plans(cfg, pfs, r.opts.Sysfs, Usage{}) {
		needUse = needUse || p.Changing()
	}
	if needUse {
		var vfs []sysfs.VF
		for i := range pfs {
			vfs = append(vfs, pfs[i].VFs...)
		}
		held, err := HeldVFs(vfs, r.opts.Holders)
		if err != nil {
			logger.Error(err, "Cannot tell who holds VFs open; VF count changes wait")
			held = map[string]string{}
			for _, vf := range vfs {
				held[vf.Address] = "unknown: " + err.Error()
			}
		}
		use.Held = held
		// Only while a change is due: listing claims costs the API server.
		if r.opts.Prepared != nil {
			use.Prepared = r.opts.Prepared()
		}
		if r.opts.Allocated != nil {
			a, err := r.opts.Allocated(ctx)
			if err != nil {
				// Unknown usage must not let a change through: the PFs with
				// VFs are planned Blocked, naming this error. Logged when it
				// changes: it recurs every retry interval while the API fails.
				r.mu.Lock()
				again := r.listErr == err.Error()
				r.listErr = err.Error()
				r.mu.Unlock()
				if !again {
					logger.Error(err, "Cannot list ResourceClaims; VF count changes wait")
				}
				use.Unlisted = err
			} else {
				r.mu.Lock()
				r.listErr = ""
				r.mu.Unlock()
			}
			use.Allocated = a
		}
	}
	plans := Plans(cfg, pfs, r.opts.Sysfs, use)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiting = false
	seen := map[string]bool{}
	for _, p := range plans {
		seen[p.PF] = true
		r.waiting = r.waiting || p.Changing()
		line := p.String()
		if r.said[p.PF] == line {
			continue
		}
		r.said[p.PF] = line
		switch p.State {
		case InSync:
			logger.V(2).Info("VF count as configured", "pf", p.PF, "pfName", p.PFName, "numVFs", p.Current)
		case Pending:
			// With VFs, they are published tainted first and the write
			// comes on a later pass; from 0 there is nothing to taint.
			logger.Info("VF count change due", "pf", p.PF, "pfName", p.PFName, "current", p.Current, "desired", p.Desired, "taintedFirst", p.Current > 0)
		case Blocked:
			msg := "VF count change waits for claims"
			if len(p.Blockers) == 0 {
				msg = "VF count change waits until ResourceClaims can be listed"
			}
			logger.Info(msg, "pf", p.PF, "pfName", p.PFName, "current", p.Current, "desired", p.Desired, "blockers", blockerNames(p.Blockers), "reason", p.Reason)
			r.event(corev1.EventTypeWarning, ReasonBlocked, line)
		case Refused:
			logger.Error(errors.New(p.Reason), "VF count change refused; nothing changed", "pf", p.PF, "pfName", p.PFName, "desired", p.Desired)
			r.event(corev1.EventTypeWarning, ReasonRefused, line)
		}
	}
	for pf := range r.said {
		if !seen[pf] {
			delete(r.said, pf)
		}
	}
	return plans
}

// Waiting reports whether the last Plan left a change pending or blocked:
// the caller then re-checks sooner than its rescan interval.
func (r *Reconciler) Waiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting
}

func blockerNames(bs []Blocker) []string {
	var out []string
	for _, b := range bs {
		who := b.Claim
		if b.Holder != "" {
			who = b.Holder
		}
		if !slices.Contains(out, who) {
			out = append(out, who)
		}
	}
	return out
}

func (r *Reconciler) event(kind, reason, msg string) {
	if r.opts.Events == nil || r.opts.NodeName == "" {
		return
	}
	// The kubelet's convention for Node events: the UID is the node name.
	ref := &corev1.ObjectReference{Kind: "Node", Name: r.opts.NodeName, UID: types.UID(r.opts.NodeName)}
	r.opts.Events.Event(ref, kind, reason, msg)
}

// Apply makes the pending changes of plans, after their published taints:
// a PF with VFs changes only on a pass after the one whose publication
// tainted them, and only if the caller did not mark the plan
// AwaitingTaints. It returns whether any PF's VFs changed.
func (r *Reconciler) Apply(ctx context.Context, plans []Plan) bool {
	logger := klog.FromContext(ctx)
	changed := false
	r.mu.Lock()
	tainted := r.tainted
	r.tainted = map[string]int{}
	for _, p := range plans {
		if p.Changing() && p.Current > 0 {
			r.tainted[p.PF] = p.Desired
		}
	}
	r.mu.Unlock()
	for _, p := range plans {
		if p.State != Pending {
			continue
		}
		if d, ok := tainted[p.PF]; p.Current > 0 && (!ok || d != p.Desired || p.AwaitingTaints != "") {
			continue // tainted by this pass, or not yet in the API server: a later pass
		}
		did, err := r.apply(ctx, p)
		var blocked *BlockedError
		switch {
		case err == nil && !did:
			// Someone else (the other driver instance) made it meanwhile.
		case errors.As(err, &blocked):
			logger.Info("VF count change waits for claims", "pf", p.PF, "pfName", p.PFName, "blockers", blockerNames(blocked.Blockers))
		case err != nil:
			logger.Error(err, "VF count change failed; retrying on the next pass", "pf", p.PF, "pfName", p.PFName, "desired", p.Desired)
			r.mu.Lock()
			if r.said[p.PF] != err.Error() {
				r.said[p.PF] = err.Error()
				r.event(corev1.EventTypeWarning, ReasonFailed, err.Error())
			}
			r.mu.Unlock()
		default:
			changed = true
			msg := fmt.Sprintf("PF %s (%s): %d VFs now, as %s asks (was %d)", p.PF, p.PFName, p.Desired, p.Field, p.Current)
			logger.Info("VF count changed", "pf", p.PF, "pfName", p.PFName, "numVFs", p.Desired, "was", p.Current)
			r.event(corev1.EventTypeNormal, ReasonChanged, msg)
		}
	}
	return changed
}

// BlockedError is a change found blocked under the node lock.
type BlockedError struct {
	PF       string
	Blockers []Blocker
}

func (e *BlockedError) Error() string {
	var parts []string
	for _, b := range e.Blockers {
		parts = append(parts, b.String())
	}
	return fmt.Sprintf("PF %s: VFs in use: %s", e.PF, strings.Join(parts, "; "))
}

// apply re-checks the PF under the node lock and writes sriov_numvfs; it
// reports whether it wrote.
func (r *Reconciler) apply(ctx context.Context, p Plan) (bool, error) {
	logger := klog.FromContext(ctx)
	did := false
	run := func(prepared map[string]string) error {
		cur, vfs, err := r.current(p.PF)
		if err != nil {
			return err
		}
		if cur == p.Desired {
			return nil
		}
		use := Usage{Prepared: prepared}
		if use.Held, err = HeldVFs(vfs, r.opts.Holders); err != nil {
			return fmt.Errorf("PF %s: cannot tell whether a process holds its VFs open (%w); not changing them", p.PF, err)
		}
		// Without VFs no claim can hold one: a failing API server does
		// not stop VFs from being created.
		if r.opts.Allocated != nil && len(vfs) > 0 {
			if use.Allocated, err = r.opts.Allocated(ctx); err != nil {
				return fmt.Errorf("PF %s: cannot tell whether its VFs are allocated (%w); not changing them until ResourceClaims can be listed", p.PF, err)
			}
		}
		if bs := blockers(&sysfs.PF{VFs: vfs}, use); len(bs) > 0 {
			return &BlockedError{PF: p.PF, Blockers: bs}
		}
		did = true
		return WriteCount(r.opts.Writer, p.PF, p.PFName, cur, p.Desired)
	}
	var err error
	if r.opts.Exclusive != nil {
		err = r.opts.Exclusive(ctx, run)
	} else {
		err = run(nil)
	}
	if err != nil || !did || p.Desired == 0 {
		return did, err
	}
	if on, _ := r.autoprobe(p.PF); !on {
		// The admin turned probing off for this PF's VFs (commonly: no host
		// netdevs for VFs meant for VMs); vfnet respects it. Prepare binds
		// an unbound VF to vfio-pci through driver_override, which works
		// without autoprobe, and unprepare leaves it unbound again.
		logger.Info("PF has sriov_drivers_autoprobe=0: its new VFs stay without a driver until prepared", "pf", p.PF, "pfName", p.PFName)
	}
	return true, nil
}

// current reads the PF's sriov_numvfs and its VFs (virtfn links) now.
func (r *Reconciler) current(pf string) (int, []sysfs.VF, error) {
	dir := r.opts.Sysfs.Path(sysfs.PCIDevicesDir + "/" + pf)
	v, err := os.ReadFile(filepath.Join(dir, "sriov_numvfs"))
	if err != nil {
		return 0, nil, fmt.Errorf("PF %s: read sriov_numvfs: %w", pf, err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(v)))
	if err != nil {
		return 0, nil, fmt.Errorf("PF %s: sriov_numvfs reads %q, not a count", pf, v)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, nil, fmt.Errorf("PF %s: list its VFs: %w", pf, err)
	}
	var vfs []sysfs.VF
	for _, e := range ents {
		idx, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "virtfn"))
		if !strings.HasPrefix(e.Name(), "virtfn") || err != nil {
			continue
		}
		t, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		fn, err := r.opts.Sysfs.Function(filepath.Base(t))
		if err != nil {
			// Its driver and group are unknown: the address still names it
			// for the claims.
			fn = sysfs.Function{Address: filepath.Base(t)}
		}
		vfs = append(vfs, sysfs.VF{Function: fn, Index: idx})
	}
	return cur, vfs, nil
}

func (r *Reconciler) autoprobe(pf string) (bool, error) {
	v, err := os.ReadFile(r.opts.Sysfs.Path(sysfs.PCIDevicesDir + "/" + pf + "/sriov_drivers_autoprobe"))
	if err != nil {
		return true, err
	}
	return strings.TrimSpace(string(v)) != "0", nil
}

// WriteCount takes the PF from cur to want VFs: 0 first when both are
// non-zero (the kernel refuses N over M with EBUSY), then want. A crash
// between the writes leaves 0 VFs, which the next pass raises to want.
func WriteCount(w sysfs.Writer, pf, pfName string, cur, want int) error {
	rel := sysfs.PCIDevicesDir + "/" + pf + "/sriov_numvfs"
	if cur != 0 && want != cur {
		if err := w.WriteFile(rel, []byte("0")); err != nil {
			return fmt.Errorf("PF %s (%s): remove its %d VFs (sriov_numvfs 0): %w%s", pf, pfName, cur, err, hint(err))
		}
	}
	if want == 0 {
		return nil
	}
	if err := w.WriteFile(rel, []byte(strconv.Itoa(want))); err != nil {
		return fmt.Errorf("PF %s (%s): create %d VFs (sriov_numvfs %d): %w%s", pf, pfName, want, want, err, hint(err))
	}
	return nil
}

// hint names the fix for the errnos sriov_numvfs_store and PF drivers return.
func hint(err error) string {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return ": no PF driver is bound, or it cannot configure SR-IOV through sysfs (no sriov_configure): bind the PF's own driver"
	case errors.Is(err, syscall.ERANGE):
		return ": above sriov_totalvfs: lower numVFs"
	case errors.Is(err, syscall.EBUSY):
		return ": VFs exist already (the kernel changes a count only through 0), or the PF driver is busy: retried on the next pass"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOSPC):
		return ": the PF driver refused the count (see the kernel log: the driver may allow fewer VFs than sriov_totalvfs, or lack resources): lower numVFs"
	}
	return ""
}
