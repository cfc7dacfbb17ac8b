package hostevents

import (
	"context"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LinkSource listens to rtnetlink link notifications (RTNLGRP_LINK) in the
// network namespace of the file Netns: a link going up or down, a netdev
// added, removed or renamed, and a PF's VF settings changed (the kernel
// notifies RTM_NEWLINK after every successful setlink). Only links Watch
// accepts become events (nil: all); a node whose pods come and go adds and
// removes a veth for each, which must not cost a rescan.
type LinkSource struct {
	Netns string
	Watch func(netdev string) bool
}

// Name implements Source.
func (s LinkSource) Name() string { return "rtnetlink link notifications in " + s.Netns }

// Run implements Source.
func (s LinkSource) Run(ctx context.Context, out chan<- Event) error {
	ns, err := netns.GetFromPath(s.Netns)
	if err != nil {
		return fmt.Errorf("open network namespace %s for link notifications: %w", s.Netns, err)
	}
	defer ns.Close()
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	failed := make(chan error, 1)
	err = netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		Namespace:         &ns,
		ReceiveBufferSize: ueventBufSize,
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("subscribe to link notifications in %s: %w", s.Netns, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			// The library stops reading after an error; the caller
			// reports it and falls back to the periodic resync.
			send(ctx, out, Event{Kind: Lost, Detail: "link notifications: " + err.Error()})
			return fmt.Errorf("link notifications in %s: %w", s.Netns, err)
		case u, ok := <-updates:
			if !ok {
				return fmt.Errorf("link notifications in %s stopped", s.Netns)
			}
			if e, ok := LinkEvent(u.Header.Type, u.Link); ok && (s.Watch == nil || s.Watch(e.Device)) {
				send(ctx, out, e)
			}
		}
	}
}

// LinkEvent is the Event of an RTM_NEWLINK or RTM_DELLINK message.
func LinkEvent(msgType uint16, l netlink.Link) (Event, bool) {
	if l == nil || l.Attrs() == nil {
		return Event{}, false
	}
	e := Event{Kind: Link, Device: l.Attrs().Name, Detail: l.Attrs().OperState.String()}
	switch msgType {
	case unix.RTM_NEWLINK:
		e.Action = "new"
	case unix.RTM_DELLINK:
		e.Action = "del"
	default:
		return Event{}, false
	}
	return e, true
}

// ParseLinkMessage decodes rtnetlink messages carrying links (as read from
// an RTNLGRP_LINK socket) into events, with the same decoder the
// subscription uses.
func ParseLinkMessage(b []byte) ([]Event, error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, fmt.Errorf("parse rtnetlink message: %w", err)
	}
	var out []Event
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
			continue
		}
		hdr := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
		l, err := netlink.LinkDeserialize(&hdr, m.Data)
		if err != nil {
			return nil, fmt.Errorf("decode link message: %w", err)
		}
		if e, ok := LinkEvent(m.Header.Type, l); ok {
			out = append(out, e)
		}
	}
	return out, nil
}
