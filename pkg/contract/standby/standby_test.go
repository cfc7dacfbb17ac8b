package standby

import (
	"net"
	"regexp"
	"strings"
	"testing"
)

// The tap name is a pure function of the interface name, a valid Linux
// ifname (at most 15 bytes, no '/', ':' or space), distinct for distinct
// names in practice, and fixed: the migration target must compute the
// name the source's domain XML carries, whatever vfnet version runs there.
func TestTargetDev(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^vfsb[0-9a-f]{8}$`)
	seen := map[string]string{}
	for _, name := range []string{"a", "physnet-a", "physnet-b", "net_1", strings.Repeat("x", 63), "PHYSNET-A"} {
		dev := TargetDev(name)
		if len(dev) > MaxIfNameLen || !valid.MatchString(dev) {
			t.Errorf("TargetDev(%q) = %q: want vfsb + 8 hex digits, at most %d bytes", name, dev, MaxIfNameLen)
		}
		if TargetDev(name) != dev {
			t.Errorf("TargetDev(%q) is not stable", name)
		}
		if other, dup := seen[dev]; dup {
			t.Errorf("TargetDev(%q) = TargetDev(%q) = %q", name, other, dev)
		}
		seen[dev] = name
	}
	// Pinned: changing the derivation breaks migrations between versions.
	if got := TargetDev("physnet-a"); got != "vfsb"+pinnedPhysnetA {
		t.Errorf("TargetDev(physnet-a) = %q, want vfsb%s", got, pinnedPhysnetA)
	}
}

func TestXML(t *testing.T) {
	t.Parallel()
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	got, err := Spec{Interface: "physnet-a", MAC: mac}.XML()
	if err != nil {
		t.Fatal(err)
	}
	want := "<interface type=\"ethernet\">\n" +
		"  <mac address=\"02:00:00:00:00:01\"></mac>\n" +
		"  <target dev=\"vfsb" + pinnedPhysnetA + "\" managed=\"no\"></target>\n" +
		"  <model type=\"virtio\"></model>\n" +
		"  <teaming type=\"persistent\"></teaming>\n" +
		"  <rom enabled=\"no\"></rom>\n" +
		"  <alias name=\"ua-vfnet-sb-physnet-a\"></alias>\n" +
		"</interface>"
	if got != want {
		t.Errorf("XML:\n%s\nwant\n%s", got, want)
	}
	for _, bad := range []Spec{
		{Interface: "n"},
		{Interface: "n", MAC: net.HardwareAddr{0, 0, 0, 0, 0, 0}},
		{Interface: "n", MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}},
		{MAC: mac},
	} {
		if _, err := bad.XML(); err == nil {
			t.Errorf("Spec %+v: no error", bad)
		} else if bad.Interface != "" && !strings.Contains(err.Error(), "macAddress or VFConfig.mac") {
			t.Errorf("Spec %+v: error %v does not name the fix", bad, err)
		}
	}
}

// pinnedPhysnetA is the first 4 bytes of SHA-256("physnet-a") in hex.
const pinnedPhysnetA = "150fea27"
