package libvirtfake

import (
	"fmt"
	"net"

	libvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Event procedures and IDs from libvirt's remote_protocol.x and
// libvirt-domain.h.
const (
	procEventCallbackRegisterAny   = 316
	procEventCallbackDeregisterAny = 317
	procEventCallbackDeviceRemoved = 333

	typeMessage = 2 // VIR_NET_MESSAGE: an event the server sends unasked

	eventIDDeviceRemoved = 15 // VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED
)

// subscription is one registered domain event callback of one connection.
type subscription struct {
	conn    net.Conn
	eventID int32
}

// register handles ConnectDomainEventCallbackRegisterAny: (int eventID,
// remote_domain dom) -> int callbackID. Only DEVICE_REMOVED is ever
// delivered; other IDs are accepted and stay silent, as libvirt's are
// until their event happens.
func (s *Server) register(c net.Conn, d *dec) ([]byte, *libvirt.Error) {
	id, err := d.u32()
	if err != nil {
		return nil, badArgs(err)
	}
	s.mu.Lock()
	if s.subs == nil {
		s.subs = map[int32]subscription{}
	}
	s.nextCallback++
	cb := s.nextCallback
	s.subs[cb] = subscription{conn: c, eventID: int32(id)}
	s.mu.Unlock()
	var e enc
	e.i32(cb)
	return e.b, nil
}

// deregister handles ConnectDomainEventCallbackDeregisterAny (int callbackID).
func (s *Server) deregister(c net.Conn, d *dec) ([]byte, *libvirt.Error) {
	id, err := d.u32()
	if err != nil {
		return nil, badArgs(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sub, ok := s.subs[int32(id)]; !ok || sub.conn != c {
		return nil, &libvirt.Error{Code: uint32(libvirt.ErrInvalidArg), Message: fmt.Sprintf("invalid argument: callback %d not registered", id)}
	}
	delete(s.subs, int32(id))
	return nil, nil
}

// dropSubscriptions forgets the callbacks of a closed connection.
func (s *Server) dropSubscriptions(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, sub := range s.subs {
		if sub.conn == c {
			delete(s.subs, id)
		}
	}
}

// Detach removes the hostdev with the given alias from the running domain,
// as a live detach that QEMU completed does (KubeVirt's source launcher
// unplugs SR-IOV hostdevs this way before migrating), and then sends
// VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED with the alias to every connection
// that registered for it, as libvirt does once the guest released the
// device.
func (s *Server) Detach(domainName, alias string) error {
	s.mu.Lock()
	dom, ok := s.domains[domainName]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("libvirtfake: no domain %q", domainName)
	}
	found := false
	if dom.def.Devices != nil {
		kept := dom.def.Devices.Hostdevs[:0:0]
		for _, h := range dom.def.Devices.Hostdevs {
			if h.Alias != nil && h.Alias.Name == alias {
				found = true
				continue
			}
			kept = append(kept, h)
		}
		dom.def.Devices.Hostdevs = kept
	}
	if !found {
		s.mu.Unlock()
		return fmt.Errorf("libvirtfake: domain %q has no hostdev with alias %q", domainName, alias)
	}
	ref := dom.ref
	var targets []struct {
		id   int32
		conn net.Conn
	}
	for id, sub := range s.subs {
		if sub.eventID == eventIDDeviceRemoved {
			targets = append(targets, struct {
				id   int32
				conn net.Conn
			}{id, sub.conn})
		}
	}
	s.mu.Unlock()
	for _, t := range targets {
		// remote_domain_event_callback_device_removed_msg:
		// int callbackID; { remote_nonnull_domain dom; string devAlias }.
		var body enc
		body.i32(t.id)
		body.domain(ref)
		body.str(alias)
		var out enc
		out.u32(uint32(4 + headerLen + len(body.b)))
		for _, v := range []uint32{program, progVersion, procEventCallbackDeviceRemoved, typeMessage, 0, statusOK} {
			out.u32(v)
		}
		out.b = append(out.b, body.b...)
		// net.Conn serialises whole Writes, so an event never splits a reply.
		_, _ = t.conn.Write(out.b)
	}
	return nil
}

// HostdevAliases lists the aliases of the domain's hostdevs.
func (s *Server) HostdevAliases(domainName string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	dom, ok := s.domains[domainName]
	if !ok || dom.def.Devices == nil {
		return nil
	}
	var out []string
	for _, h := range dom.def.Devices.Hostdevs {
		if h.Alias != nil {
			out = append(out, h.Alias.Name)
		}
	}
	return out
}

// OnAttach runs hook on each attach request as it arrives, before it is
// applied: a test sees the host as the device is plugged (a VF's MAC must
// be set before then).
func (s *Server) OnAttach(hook func(Attach)) {
	s.mu.Lock()
	s.attachHook = hook
	s.mu.Unlock()
}

// Plug adds a hostdev to the running domain without recording an attach,
// as if the domain had started with it.
func (s *Server) Plug(domainName, hostdevXML string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lerr := s.applyLocked(domainName, hostdevXML, 0); lerr != nil {
		return fmt.Errorf("libvirtfake: plug into %q: %s", domainName, lerr.Message)
	}
	return nil
}

// Subscribers counts the registered device-removed callbacks.
func (s *Server) Subscribers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sub := range s.subs {
		if sub.eventID == eventIDDeviceRemoved {
			n++
		}
	}
	return n
}

// DefineRunningPersistent adds a running domain that also has a saved
// definition, as KubeVirt's launcher defines it (and a migration target
// receives it): attaches with VIR_DOMAIN_AFFECT_CONFIG then change the
// definition too (ConfigXML).
func (s *Server) DefineRunningPersistent(domXML string) error {
	if err := s.DefineRunning(domXML); err != nil {
		return err
	}
	var cfg libvirtxml.Domain
	if err := cfg.Unmarshal(domXML); err != nil {
		return fmt.Errorf("libvirtfake: parse domain XML: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.domains[cfg.Name]
	d.persistent, d.config = true, cfg
	return nil
}

// ConfigHostdevAliases lists the hostdev aliases of a persistent domain's
// saved definition.
func (s *Server) ConfigHostdevAliases(domainName string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	dom, ok := s.domains[domainName]
	if !ok || dom.config.Devices == nil {
		return nil
	}
	var out []string
	for _, h := range dom.config.Devices.Hostdevs {
		if h.Alias != nil {
			out = append(out, h.Alias.Name)
		}
	}
	return out
}
