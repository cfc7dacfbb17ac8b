package attach

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"
)

// DefaultKubeletPodsDir is where the kubelet keeps pod volumes.
const DefaultKubeletPodsDir = "/var/lib/kubelet/pods"

// SocketName is the launcher's libvirt socket in the libvirt-runtime emptyDir.
const SocketName = "virtqemud-sock"

// RuntimeDir is the node path of a launcher pod's libvirt-runtime emptyDir,
// mounted at /var/run/libvirt in its compute container.
func RuntimeDir(podsDir, podUID string) string {
	return filepath.Join(podsDir, podUID, "volumes", "kubernetes.io~empty-dir", "libvirt-runtime")
}

// Session is what the attach needs from one launcher's libvirt.
type Session interface {
	// DomainXML returns the live XML of the named domain.
	DomainXML(domain string) (string, error)
	// AttachDevice hot-plugs a device into the running domain and, when
	// the domain is persistent (as KubeVirt defines it, and as a migration
	// target receives it), into its saved definition too.
	AttachDevice(domain, deviceXML string) error
	// DeviceRemoved delivers the alias of every device libvirt reports
	// removed from a domain of this daemon (VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED)
	// until ctx ends or the connection drops, then closes the channel.
	DeviceRemoved(ctx context.Context) (<-chan string, error)
	Close() error
}

// Dialer opens a Session to the libvirt serving runtimeDir.
type Dialer interface {
	Dial(ctx context.Context, runtimeDir string) (Session, error)
}

// SessionDialer reaches the session virtqemud of a launcher pod with
// go-libvirt. The node path of the socket is longer than a unix socket path
// may be, so it dials /proc/self/fd/<fd>/virtqemud-sock through an O_PATH
// descriptor of the directory; as root that needs only CAP_DAC_OVERRIDE
// (the socket is owned by qemu, mode 0700).
type SessionDialer struct {
	// Timeout bounds the connect; zero means 5s.
	Timeout time.Duration
}

// Dial connects with URI qemu:///session: the daemon refuses qemu:///system.
func (d SessionDialer) Dial(ctx context.Context, runtimeDir string) (Session, error) {
	fd, err := unix.Open(runtimeDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open launcher libvirt-runtime dir %s: %w", runtimeDir, err)
	}
	// The descriptor only has to live until the socket is connected.
	defer func() { _ = unix.Close(fd) }()
	timeout := d.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	d2 := &connDialer{path: fmt.Sprintf("/proc/self/fd/%d/%s", fd, SocketName), timeout: timeout}
	lv := libvirt.NewWithDialer(d2)
	s := &session{lv: lv, dialer: d2, done: make(chan struct{})}
	// go-libvirt calls take no context: closing the connection when ctx
	// ends fails the pending call, so a wedged daemon cannot hang us.
	go func() {
		select {
		case <-ctx.Done():
			d2.close()
		case <-s.done:
		}
	}()
	if err := lv.ConnectToURI(libvirt.QEMUSession); err != nil {
		close(s.done)
		d2.close()
		return nil, fmt.Errorf("connect to %s with %s: %w", filepath.Join(runtimeDir, SocketName), libvirt.QEMUSession, err)
	}
	return s, nil
}

// connDialer dials the socket and keeps the connection so it can be closed
// from outside go-libvirt.
type connDialer struct {
	path    string
	timeout time.Duration
	mu      sync.Mutex
	conn    net.Conn
}

func (d *connDialer) Dial() (net.Conn, error) {
	c, err := net.DialTimeout("unix", d.path, d.timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conn = c
	d.mu.Unlock()
	return c, nil
}

func (d *connDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		_ = d.conn.Close()
	}
}

type session struct {
	lv     *libvirt.Libvirt
	dialer *connDialer
	done   chan struct{}
}

func (s *session) DomainXML(name string) (string, error) {
	dom, err := s.lv.DomainLookupByName(name)
	if err != nil {
		return "", fmt.Errorf("look up domain %q: %w", name, err)
	}
	x, err := s.lv.DomainGetXMLDesc(dom, 0)
	if err != nil {
		return "", fmt.Errorf("get live XML of domain %q: %w", name, err)
	}
	return x, nil
}

func (s *session) AttachDevice(name, deviceXML string) error {
	dom, err := s.lv.DomainLookupByName(name)
	if err != nil {
		return fmt.Errorf("look up domain %q: %w", name, err)
	}
	// KubeVirt detaches SR-IOV hostdevs from the live domain and its
	// definition (hostdevice/hotplug.go, affectLiveAndConfigLibvirtFlags)
	// and attaches them the same way: a live-only attach would leave the
	// definition without the VF, and the next migration's detach would
	// fail on it ("device not present in domain configuration").
	flags := uint32(libvirt.DomainAffectLive)
	persistent, err := s.lv.DomainIsPersistent(dom)
	if err != nil {
		return fmt.Errorf("ask whether domain %q is persistent: %w", name, err)
	}
	if persistent == 1 {
		flags |= uint32(libvirt.DomainAffectConfig)
	}
	if err := s.lv.DomainAttachDeviceFlags(dom, deviceXML, flags); err != nil {
		return fmt.Errorf("attach device to domain %q: %w", name, err)
	}
	return nil
}

func (s *session) DeviceRemoved(ctx context.Context) (<-chan string, error) {
	evs, err := s.lv.SubscribeEvents(ctx, libvirt.DomainEventIDDeviceRemoved, libvirt.OptDomain{})
	if err != nil {
		return nil, fmt.Errorf("subscribe to device-removed events: %w", err)
	}
	out := make(chan string)
	go func() {
		defer close(out)
		for ev := range evs {
			m, ok := ev.(*libvirt.DomainEventCallbackDeviceRemovedMsg)
			if !ok {
				continue
			}
			select {
			case out <- m.Msg.DevAlias:
			case <-ctx.Done():
				// Drain so go-libvirt's router never blocks on us.
				for range evs {
				}
				return
			}
		}
	}()
	return out, nil
}

func (s *session) Close() error {
	// Disconnect says goodbye to the daemon; the ctx watcher still guards it.
	err := s.lv.Disconnect()
	close(s.done)
	s.dialer.close()
	return err
}
