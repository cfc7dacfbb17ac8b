package attach_test

import (
	"context"
	"os"
	"testing"

	libvirt "github.com/digitalocean/go-libvirt"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
)

// TestAttachPersistentDomainKeepsDefinition: KubeVirt's launcher defines
// its domain persistent and detaches SR-IOV hostdevs from the live domain
// and the definition; vfnet's attach must put the VF back into both, or
// the next migration's detach fails on the definition. A transient domain
// gets a live-only attach (the fake, as libvirt, refuses config there:
// TestAttachHotplugsWithGuestAddressAndBootOrder).
func TestAttachPersistentDomainKeepsDefinition(t *testing.T) {
	t.Parallel()
	pods := podsDir(t)
	rd := attach.RuntimeDir(pods, podUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := libvirtfake.Listen(rd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunningPersistent(domainXML); err != nil {
		t.Fatal(err)
	}
	a := &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods}
	res, err := a.AttachOnce(context.Background(), attach.Request{PodUID: podUID, Domain: testDomain,
		Hostdevs: []attach.Hostdev{{Interface: "dra-net", Source: mustPCI(t, "0000:3b:02.1")}}})
	if err != nil || len(res.Attached) != 1 {
		t.Fatalf("attach: %+v %v", res, err)
	}
	got := srv.Attaches()
	want := uint32(libvirt.DomainAffectLive | libvirt.DomainAffectConfig)
	if len(got) != 1 || got[0].Flags != want {
		t.Fatalf("attaches %+v, want one with flags %d (live and config)", got, want)
	}
	if al := srv.ConfigHostdevAliases(testDomain); len(al) != 1 || al[0] != attach.Alias("dra-net") {
		t.Errorf("saved definition's hostdevs %v, want [%s]", al, attach.Alias("dra-net"))
	}
	if al := srv.HostdevAliases(testDomain); len(al) != 1 || al[0] != attach.Alias("dra-net") {
		t.Errorf("live hostdevs %v, want [%s]", al, attach.Alias("dra-net"))
	}
}
