package libvirtfake_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
)

const hostdev = `<hostdev mode='subsystem' type='pci' managed='no'><source><address domain='0x0000' bus='0x3b' slot='0x02' function='0x1'/></source><alias name='ua-sriov-x'/></hostdev>`

func TestValidateDomainRejectsInvalidHostdev(t *testing.T) {
	t.Parallel()
	err := libvirtfake.ValidateDomain(libvirtfake.WrapHostdev("d", hostdev))
	if errors.Is(err, libvirtfake.ErrNoValidator) {
		t.Fatalf("%v: install it (make deps, or apt-get install libvirt-clients)", err)
	}
	if err != nil {
		t.Fatalf("valid hostdev rejected: %v", err)
	}
	bad := strings.Replace(hostdev, "managed='no'", "managed='sometimes'", 1)
	if err := libvirtfake.ValidateDomain(libvirtfake.WrapHostdev("d", bad)); err == nil {
		t.Fatal("virt-xml-validate accepted managed='sometimes'")
	}
}

func TestServerRefusesSystemURIAndDuplicateAlias(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	srv, err := libvirtfake.Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunning(`<domain type='kvm'><name>ns_vm</name><memory>1024</memory><os><type>hvm</type></os></domain>`); err != nil {
		t.Fatal(err)
	}
	sys := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(srv.Path())))
	if err := sys.ConnectToURI(libvirt.QEMUSystem); err == nil || !strings.Contains(err.Error(), "qemu:///session") {
		t.Fatalf("qemu:///system: %v, want a refusal naming qemu:///session", err)
	}
	lv := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(srv.Path())))
	if err := lv.ConnectToURI(libvirt.QEMUSession); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lv.Disconnect() }()
	dom, err := lv.DomainLookupByName("ns_vm")
	if err != nil {
		t.Fatal(err)
	}
	if err := lv.DomainAttachDeviceFlags(dom, hostdev, uint32(libvirt.DomainAffectConfig)); err == nil {
		t.Fatal("config attach to a transient domain accepted")
	}
	if err := lv.DomainAttachDeviceFlags(dom, hostdev, uint32(libvirt.DomainAffectLive)); err != nil {
		t.Fatal(err)
	}
	if err := lv.DomainAttachDeviceFlags(dom, hostdev, uint32(libvirt.DomainAffectLive)); err == nil || !strings.Contains(err.Error(), "non unique alias") {
		t.Fatalf("second attach with the same alias: %v", err)
	}
	x, err := lv.DomainGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(x, "ua-sriov-x") != 1 {
		t.Fatalf("live XML should hold the hostdev once:\n%s", x)
	}
	if n := len(srv.Attaches()); n != 3 {
		t.Fatalf("recorded %d attach requests, want 3 (failed ones included)", n)
	}
}
