// Package libvirtfake is a small libvirt RPC server that stands in for a
// virt-launcher's session virtqemud in tests. It speaks libvirt's wire
// protocol (so the real go-libvirt client talks to it), keeps transient
// running domains, and applies and records every hostdev hot-plug the way
// libvirt checks it: unique alias, one user per host PCI device, a transient
// domain accepts only live changes.
package libvirtfake

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"
)

// SocketName is the launcher's libvirt socket inside the libvirt-runtime dir.
const SocketName = "virtqemud-sock"

// Wire constants from libvirt's remote_protocol.x.
const (
	program      = 0x20008086
	progVersion  = 1
	typeCall     = 0
	typeReply    = 1
	statusOK     = 0
	statusError  = 1
	headerLen    = 24
	maxPacketLen = 32 << 20

	procConnectOpen            = 1
	procConnectClose           = 2
	procDomainGetXMLDesc       = 14
	procDomainLookupByName     = 23
	procAuthList               = 66
	procDomainAttachDeviceFlag = 160
	procDomainIsPersistent     = 151

	affectConfig = 2 // VIR_DOMAIN_AFFECT_CONFIG
)

// Attach is one hot-plug the fake received.
type Attach struct {
	Domain string
	XML    string
	Flags  uint32
	// At is when the request arrived, before it was applied.
	At time.Time
}

type domain struct {
	ref domainRef
	def libvirtxml.Domain
	// persistent domains have a saved definition that a config change
	// (VIR_DOMAIN_AFFECT_CONFIG) updates; config keeps it.
	persistent bool
	config     libvirtxml.Domain
}

// Server is a fake session virtqemud listening on one unix socket.
type Server struct {
	ln    net.Listener
	dirFD int
	path  string

	mu        sync.Mutex
	domains   map[string]*domain
	attaches  []Attach
	uris      []string
	attachErr *libvirt.Error
	notify    chan Attach
	nextID    int32
	conns     map[net.Conn]bool
	// subs are the domain event callbacks registered, by callback ID.
	subs         map[int32]subscription
	nextCallback int32
	attachHook   func(Attach)

	wg sync.WaitGroup
}

// Listen serves on <runtimeDir>/virtqemud-sock. Like the driver, it reaches
// the directory through an O_PATH descriptor so a kubelet-length path works
// despite the 108-byte unix socket limit.
func Listen(runtimeDir string) (*Server, error) {
	fd, err := unix.Open(runtimeDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("libvirtfake: open runtime dir %s: %w", runtimeDir, err)
	}
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, SocketName)
	ln, err := net.Listen("unix", short)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("libvirtfake: listen on %s: %w", filepath.Join(runtimeDir, SocketName), err)
	}
	// The real daemon's socket is owned by qemu with mode 0700.
	_ = os.Chmod(short, 0o700)
	s := &Server{
		ln: ln, dirFD: fd, path: filepath.Join(runtimeDir, SocketName),
		domains: map[string]*domain{}, notify: make(chan Attach, 64),
		conns: map[net.Conn]bool{}, nextID: 1,
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Path is the socket's full (possibly over-long) path.
func (s *Server) Path() string { return s.path }

// Close stops serving, drops all connections and removes the socket.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	_ = unix.Close(s.dirFD)
	return err
}

// DefineRunning adds a running transient domain from its XML.
func (s *Server) DefineRunning(domXML string) error {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domXML); err != nil {
		return fmt.Errorf("libvirtfake: parse domain XML: %w", err)
	}
	if d.Name == "" {
		return errors.New("libvirtfake: domain XML has no <name>")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var uuid [16]byte
	copy(uuid[:], d.Name) // stable and unique enough for a fake
	s.domains[d.Name] = &domain{ref: domainRef{name: d.Name, uuid: uuid, id: s.nextID}, def: d}
	s.nextID++
	return nil
}

// DomainXML returns the domain's current live XML.
func (s *Server) DomainXML(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.domains[name]
	if !ok {
		return "", fmt.Errorf("libvirtfake: no domain %q", name)
	}
	return d.def.Marshal()
}

// FailAttaches makes every later attach fail with this libvirt error, as
// libvirt does without VFIO ("host doesn't support passthrough of host PCI
// devices", code 67). A nil error restores success.
func (s *Server) FailAttaches(e *libvirt.Error) {
	s.mu.Lock()
	s.attachErr = e
	s.mu.Unlock()
}

// Attaches returns every attach request received so far, failed ones included.
func (s *Server) Attaches() []Attach {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Attach(nil), s.attaches...)
}

// Notify delivers each attach request as it arrives (buffered; a slow reader
// misses none until 64 are pending, after which the oldest wait).
func (s *Server) Notify() <-chan Attach { return s.notify }

// ConnectURIs returns the URIs clients opened, in order.
func (s *Server) ConnectURIs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.uris...)
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
			s.dropSubscriptions(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		}()
	}
}

type header struct {
	prog, vers, proc, typ, serial, status uint32
}

func (s *Server) handle(c net.Conn) {
	opened := false
	for {
		var lenBuf [4]byte
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(lenBuf[:])
		if n < 4+headerLen || n > maxPacketLen {
			return
		}
		pkt := make([]byte, n-4)
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		d := &dec{b: pkt}
		var h header
		for _, p := range []*uint32{&h.prog, &h.vers, &h.proc, &h.typ, &h.serial, &h.status} {
			*p, _ = d.u32()
		}
		if h.typ != typeCall {
			continue // streams and messages are not used by the attach path
		}
		payload, lerr := s.call(c, h, d, &opened)
		if err := reply(c, h, payload, lerr); err != nil {
			return
		}
		if h.proc == procConnectClose && lerr == nil {
			return
		}
	}
}

// call runs one procedure and returns its reply payload or a libvirt error.
func (s *Server) call(c net.Conn, h header, d *dec, opened *bool) ([]byte, *libvirt.Error) {
	if h.prog != program {
		return nil, &libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: fmt.Sprintf("unknown program 0x%x", h.prog)}
	}
	var e enc
	switch h.proc {
	case procAuthList:
		e.u32(1)
		e.u32(0) // REMOTE_AUTH_NONE
		return e.b, nil
	case procConnectOpen:
		uri, err := d.optStr()
		if err != nil {
			return nil, badArgs(err)
		}
		u := ""
		if uri != nil {
			u = *uri
		}
		s.mu.Lock()
		s.uris = append(s.uris, u)
		s.mu.Unlock()
		// A session daemon serves only the session URI (docs/migration.md).
		if u != string(libvirt.QEMUSession) {
			return nil, &libvirt.Error{Code: uint32(libvirt.ErrNoConnect),
				Message: fmt.Sprintf("unsupported configuration: cannot open %q on a session daemon, try qemu:///session", u)}
		}
		*opened = true
		return nil, nil
	case procConnectClose:
		*opened = false
		return nil, nil
	}
	if !*opened {
		return nil, &libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: "internal error: connection not open"}
	}
	switch h.proc {
	case procDomainLookupByName:
		name, err := d.str()
		if err != nil {
			return nil, badArgs(err)
		}
		s.mu.Lock()
		dom, ok := s.domains[name]
		s.mu.Unlock()
		if !ok {
			return nil, noDomain(name)
		}
		e.domain(dom.ref)
		return e.b, nil
	case procDomainGetXMLDesc:
		ref, err := d.domain()
		if err != nil {
			return nil, badArgs(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		dom, ok := s.domains[ref.name]
		if !ok {
			return nil, noDomain(ref.name)
		}
		x, merr := dom.def.Marshal()
		if merr != nil {
			return nil, &libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: merr.Error()}
		}
		e.str(x)
		return e.b, nil
	case procDomainIsPersistent:
		ref, err := d.domain()
		if err != nil {
			return nil, badArgs(err)
		}
		s.mu.Lock()
		dom, ok := s.domains[ref.name]
		s.mu.Unlock()
		if !ok {
			return nil, noDomain(ref.name)
		}
		if dom.persistent {
			e.i32(1)
		} else {
			e.i32(0)
		}
		return e.b, nil
	case procDomainAttachDeviceFlag:
		ref, err := d.domain()
		if err != nil {
			return nil, badArgs(err)
		}
		x, err := d.str()
		if err != nil {
			return nil, badArgs(err)
		}
		flags, err := d.u32()
		if err != nil {
			return nil, badArgs(err)
		}
		return nil, s.attach(ref.name, x, flags)
	case procEventCallbackRegisterAny:
		return s.register(c, d)
	case procEventCallbackDeregisterAny:
		return s.deregister(c, d)
	}
	return nil, &libvirt.Error{Code: uint32(libvirt.ErrNoSupport), Message: fmt.Sprintf("unknown procedure: %d", h.proc)}
}

func (s *Server) attach(name, x string, flags uint32) *libvirt.Error {
	a := Attach{Domain: name, XML: x, Flags: flags, At: time.Now()}
	s.mu.Lock()
	hook := s.attachHook
	s.mu.Unlock()
	if hook != nil {
		hook(a)
	}
	s.mu.Lock()
	s.attaches = append(s.attaches, a)
	lerr := s.applyLocked(name, x, flags)
	s.mu.Unlock()
	select {
	case s.notify <- a:
	default:
	}
	return lerr
}

func (s *Server) applyLocked(name, x string, flags uint32) *libvirt.Error {
	dom, ok := s.domains[name]
	if !ok {
		return noDomain(name)
	}
	if flags&affectConfig != 0 && !dom.persistent {
		return &libvirt.Error{Code: uint32(libvirt.ErrOperationInvalid), Message: "Requested operation is not valid: cannot modify device on transient domain"}
	}
	if s.attachErr != nil {
		return s.attachErr
	}
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(x); err != nil {
		return &libvirt.Error{Code: uint32(libvirt.ErrXMLError), Message: "XML error: " + err.Error()}
	}
	if hd.SubsysPCI == nil || hd.SubsysPCI.Source == nil || hd.SubsysPCI.Source.Address == nil {
		return &libvirt.Error{Code: uint32(libvirt.ErrXMLError), Message: "XML error: hostdev has no PCI source address"}
	}
	if dom.def.Devices == nil {
		dom.def.Devices = &libvirtxml.DomainDeviceList{}
	}
	src := pciKey(hd.SubsysPCI.Source.Address)
	for _, old := range dom.def.Devices.Hostdevs {
		if hd.Alias != nil && old.Alias != nil && old.Alias.Name == hd.Alias.Name {
			return &libvirt.Error{Code: uint32(libvirt.ErrXMLError), Message: "XML error: non unique alias detected: " + hd.Alias.Name}
		}
		if old.SubsysPCI != nil && old.SubsysPCI.Source != nil && old.SubsysPCI.Source.Address != nil {
			if pciKey(old.SubsysPCI.Source.Address) == src {
				return &libvirt.Error{Code: uint32(libvirt.ErrOperationInvalid), Message: "Requested operation is not valid: PCI device " + src + " is in use by this domain"}
			}
		}
	}
	dom.def.Devices.Hostdevs = append(dom.def.Devices.Hostdevs, hd)
	if flags&affectConfig != 0 {
		if dom.config.Devices == nil {
			dom.config.Devices = &libvirtxml.DomainDeviceList{}
		}
		dom.config.Devices.Hostdevs = append(dom.config.Devices.Hostdevs, hd)
	}
	return nil
}

func noDomain(name string) *libvirt.Error {
	return &libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: fmt.Sprintf("Domain not found: no domain with matching name '%s'", name)}
}

func badArgs(err error) *libvirt.Error {
	return &libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "malformed call arguments: " + err.Error()}
}

func reply(c net.Conn, h header, payload []byte, lerr *libvirt.Error) error {
	var body enc
	status := uint32(statusOK)
	if lerr != nil {
		status = statusError
		// remote_error: code, domain, message, level, dom, str1..3, int1, int2, net.
		msg := lerr.Message
		body.i32(int32(lerr.Code))
		body.i32(10) // VIR_FROM_QEMU
		body.optStr(&msg)
		body.i32(2) // VIR_ERR_ERROR
		body.u32(0)
		body.optStr(nil)
		body.optStr(nil)
		body.optStr(nil)
		body.i32(-1)
		body.i32(-1)
		body.u32(0)
	} else {
		body.b = payload
	}
	var out enc
	out.u32(uint32(4 + headerLen + len(body.b)))
	for _, v := range []uint32{h.prog, h.vers, h.proc, typeReply, h.serial, status} {
		out.u32(v)
	}
	out.b = append(out.b, body.b...)
	_, err := c.Write(out.b)
	return err
}

func pciKey(a *libvirtxml.DomainAddressPCI) string {
	v := func(p *uint) uint {
		if p == nil {
			return 0
		}
		return *p
	}
	return pciaddr.Address{Domain: v(a.Domain), Bus: v(a.Bus), Slot: v(a.Slot), Function: v(a.Function)}.String()
}

// ErrNoValidator is returned by ValidateDomain when virt-xml-validate or
// xmllint is not installed (Debian: libvirt-clients and libxml2-utils).
var ErrNoValidator = errors.New("virt-xml-validate or xmllint not found: apt-get install libvirt-clients libxml2-utils")

// ValidateDomain checks a whole <domain> document against libvirt's schema
// with virt-xml-validate.
func ValidateDomain(domXML string) error {
	for _, bin := range []string{"virt-xml-validate", "xmllint"} {
		if _, err := exec.LookPath(bin); err != nil {
			return ErrNoValidator
		}
	}
	f, err := os.CreateTemp("", "vfdom-*.xml")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.WriteString(domXML); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	out, err := exec.Command("virt-xml-validate", f.Name(), "domain").CombinedOutput()
	if err != nil {
		return fmt.Errorf("virt-xml-validate: %w: %s\n%s", err, out, domXML)
	}
	return nil
}

// WrapHostdev puts a hostdev into a minimal valid running-guest domain, so
// it can be validated as a whole document.
func WrapHostdev(name, hostdevXML string) string {
	return "<domain type='kvm'><name>" + name + "</name><memory unit='KiB'>1048576</memory>" +
		"<os><type arch='x86_64' machine='q35'>hvm</type></os><devices>" + hostdevXML + "</devices></domain>"
}
