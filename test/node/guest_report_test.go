package node

import (
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

// pfTable is the kubevirt case's last PF report only, whatever the guest
// printed between and around its lines.
func TestGuestPFTableIsTheLastReport(t *testing.T) {
	g := &guestVM{console: &syncbuf.Buffer{}}
	mark := layout.MarkKubeVirt
	g.console.Write([]byte("[ 1.0] kernel line\n" +
		mark + " pf: eth0:\n" +
		mark + " pf:   vf 0     link/ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff, spoof checking on\n" +
		mark + " pf:  eth2:\n" +
		mark + " pf:   vf 0     link/ether 02:00:00:00:00:01 brd ff:ff:ff:ff:ff:ff, vlan 100, spoof checking on\n" +
		mark + " vm: [ 3.0] igbvf 0000:01:00.0: Address: 02:00:00:00:00:01\n" +
		"noise " + mark + " pf: eth0:\n" +
		mark + " pf:   vf 0     link/ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff, spoof checking on\n" +
		mark + " pf:  eth2:\r\n" +
		mark + " pf:   vf 0     link/ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff, spoof checking on\n"))
	table := g.pfTable()
	want := []string{"eth0:", "vf 0     link/ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff, spoof checking on",
		"eth2:", "vf 0     link/ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff, spoof checking on"}
	if strings.Join(table, "\n") != strings.Join(want, "\n") {
		t.Errorf("pfTable = %q, want %q", table, want)
	}
	if l := vfWith(table, "02:00:00:00:00:01"); l != "" {
		t.Errorf("vfWith found the released MAC: %q", l)
	}
	if l := vfWith(table, "spoof"); !strings.HasPrefix(l, "vf 0") {
		t.Errorf("vfWith(spoof) = %q", l)
	}
}
