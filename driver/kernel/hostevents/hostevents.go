// Package hostevents turns what the kernel and the node configuration report
// into one stream of "the host changed" notifications, so that the driver
// rescans when something happens instead of polling: kobject uevents (PCI
// functions added or removed, drivers bound or unbound, sriov_numvfs
// changes, netdevs added, removed or renamed), rtnetlink link notifications
// (a PF's link state, its VF settings) and the node configuration file's
// changes (the kubelet's atomic symlink swap of a ConfigMap volume).
//
// Sources deliver Events; Coalesce turns a burst (one sriov_numvfs write
// brings hundreds of uevents) into one call with its causes.
package hostevents

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind says which source reported an event.
type Kind string

const (
	// Uevent is a kobject uevent (NETLINK_KOBJECT_UEVENT).
	Uevent Kind = "uevent"
	// Link is an rtnetlink link notification (RTNLGRP_LINK).
	Link Kind = "link"
	// Config is a change of the node configuration file.
	Config Kind = "config"
	// Lost says a source may have missed events (a receive buffer
	// overflowed, a watch broke): the next rescan must not trust that
	// nothing changed.
	Lost Kind = "lost"
)

// Event is one change the host reported.
type Event struct {
	Kind Kind
	// Action is the uevent's action (add, remove, bind, unbind, change,
	// move), or for a link "new" or "del".
	Action string
	// Subsystem is the uevent's subsystem (pci, net).
	Subsystem string
	// Device names what changed: a PCI address, a netdev, a file.
	Device string
	// Detail is what else the event said (the driver bound, the link's
	// operational state, the old name of a renamed netdev).
	Detail string
	// Function is, for a netdev's uevent, the PCI function the netdev
	// belongs to (from its DEVPATH); "" for a virtual netdev (a veth,
	// a bridge), which no PF is.
	Function string
}

func (e Event) String() string {
	var b strings.Builder
	b.WriteString(string(e.Kind))
	for _, s := range []string{e.Action, e.Subsystem, e.Device, e.Detail} {
		if s != "" {
			b.WriteByte(' ')
			b.WriteString(s)
		}
	}
	return b.String()
}

// Source delivers events to out until ctx ends or it fails for good.
type Source interface {
	// Name says what the source listens to, for logs.
	Name() string
	Run(ctx context.Context, out chan<- Event) error
}

// Coalesce calls fn with the events of each burst read from in: once no
// event came for quiet, or max after the burst's first event, whichever is
// sooner. It returns when ctx ends or in is closed.
func Coalesce(ctx context.Context, in <-chan Event, quiet, max time.Duration, fn func([]Event)) {
	var (
		batch    []Event
		quietT   *time.Timer
		deadline <-chan time.Time
		idle     <-chan time.Time
	)
	flush := func() {
		if len(batch) > 0 {
			fn(batch)
		}
		batch, deadline, idle = nil, nil, nil
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-in:
			if !ok {
				flush()
				return
			}
			if len(batch) == 0 {
				deadline = time.After(max)
			}
			batch = append(batch, e)
			if quietT == nil {
				quietT = time.NewTimer(quiet)
			} else {
				quietT.Reset(quiet)
			}
			idle = quietT.C
		case <-idle:
			flush()
		case <-deadline:
			flush()
		}
	}
}

// Summary describes a burst in one short line: how many events of each
// kind, every distinct link, config and lost event (rare, and each may
// alone explain a rescan), and of the uevents the first two distinct ones
// and the last (for a sriov_numvfs write, the PF's change).
func Summary(events []Event) string {
	if len(events) == 0 {
		return "no events"
	}
	counts := map[Kind]int{}
	seen := map[string]bool{}
	var others, uevents []string
	var lastU string
	nU := 0
	for _, e := range events {
		counts[e.Kind]++
		str := e.String()
		if e.Kind != Uevent {
			if !seen[str] {
				seen[str] = true
				others = append(others, str)
			}
			continue
		}
		nU++
		lastU = str
		if !seen[str] && len(uevents) < 2 {
			seen[str] = true
			uevents = append(uevents, str)
		}
	}
	if lastU != "" && !seen[lastU] {
		if nU > len(uevents)+1 {
			uevents = append(uevents, "...")
		}
		uevents = append(uevents, lastU)
	}
	kinds := make([]string, 0, len(counts))
	for k, n := range counts {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	return strings.Join(kinds, ", ") + ": " + strings.Join(append(others, uevents...), "; ")
}
