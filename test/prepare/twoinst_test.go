package prepare

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// During a rolling update two driver instances serve one node, and the
// kubelet may prepare a claim through one and unprepare it through the
// other. These tests run two States on one plugin directory in one process;
// TestRollingUpdateTwoDrivers (cmd/vfnet-driver/app) does it with two real
// driver processes.

func tryPrepare(s *prepare.State, c *resourceapi.ResourceClaim) error {
	res, err := s.Prepare(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		return err
	}
	return res[c.UID].Err
}

func tryUnprepare(s *prepare.State, c *resourceapi.ResourceClaim) error {
	res, err := s.Unprepare(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}})
	if err != nil {
		return err
	}
	return res[c.UID]
}

func claimUIDs(s *prepare.State) []string {
	var out []string
	for uid := range maps.Keys(s.Snapshot().Claims) {
		out = append(out, string(uid))
	}
	slices.Sort(out)
	return out
}

func TestTwoInstancesShareTheCheckpoint(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
	before := e.Snapshot(t)
	a, b := e.NewState(t, nil), e.NewState(t, nil)
	cfg := preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":7,"mac":"02:00:00:00:07:01"}`)
	c1 := preparetest.Claim("ns", "c1", "uid-1", []string{"vf-0000-3b-02-1"}, cfg)
	c2 := preparetest.Claim("ns", "c2", "uid-2", []string{"vf-0000-3b-02-2"})
	rival := preparetest.Claim("ns", "rival", "uid-3", []string{"vf-0000-3b-02-2"})
	for _, c := range []*resourceapi.ResourceClaim{c1, c2, rival} {
		e.AddClaim(t, c)
	}

	prepareClaim(t, a, c1)
	prepared := e.Snapshot(t)
	// b knows what a did: the VF is vfnet's (so b keeps offering it), and
	// a repeated prepare through b reports the devices without redoing
	// anything.
	if !b.Owned("0000:3b:02.1") {
		t.Fatal("instance b does not count the VF instance a prepared as vfnet's")
	}
	res, err := b.Prepare(context.Background(), []*resourceapi.ResourceClaim{c1})
	if err != nil || res[c1.UID].Err != nil {
		t.Fatalf("repeated prepare through b: %v %v", err, res[c1.UID].Err)
	}
	if d := res[c1.UID].Devices; len(d) != 1 || d[0].CDIDeviceIDs[0] != "sriov.vfnet.io/vf=uid-1-vf-0000-3b-02-1" {
		t.Fatalf("repeated prepare through b returned %+v", d)
	}
	if got := e.Snapshot(t); got.String() != prepared.String() {
		t.Fatalf("repeated prepare through b changed the host:\n%s\nwant\n%s", got, prepared)
	}

	// Prepared through a, unprepared through b: the VF is restored.
	unprepareClaim(t, b, c1)
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("after unprepare through the other instance the host is\n%s\nwant\n%s", got, before)
	}
	if b.Owned("0000:3b:02.1") || a.Owned("0000:3b:02.1") {
		t.Fatal("an unprepared VF still counts as vfnet's")
	}

	// a writes the checkpoint again: the entry b removed does not come back.
	prepareClaim(t, a, c2)
	if got := claimUIDs(b); !slices.Equal(got, []string{"uid-2"}) {
		t.Fatalf("checkpoint holds %v, want only uid-2", got)
	}
	// And b will not hand a's VF to another claim.
	if err := tryPrepare(b, rival); err == nil || !strings.Contains(err.Error(), "already prepared for claim ns/c2") {
		t.Fatalf("rival prepare through b: %v", err)
	}
	unprepareClaim(t, b, c2)
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after both claims:\n%s\nwant\n%s", got, before)
	}
	if got := claimUIDs(a); len(got) != 0 {
		t.Fatalf("checkpoint keeps %v", got)
	}
}

// Both instances at once: each claim is prepared through one instance and
// unprepared through the other, all concurrently, with rival claims for
// the same VFs prepared through the other instance. Per VF exactly one
// claim wins, and every VF ends restored.
func TestTwoInstancesStorm(t *testing.T) {
	t.Parallel()
	const n, dup = 32, 8
	spec := simhost.Spec{PFs: []simhost.PFSpec{simhost.E810PF("0000:3b:00.0", "enp59s0f0", n)}}
	e := preparetest.NewEnv(t, preparetest.FastDir(), spec)
	before := e.Snapshot(t)
	inst := []*prepare.State{e.NewState(t, nil), e.NewState(t, nil)}

	var claims []*resourceapi.ResourceClaim
	names := make([]string, n)
	for i := range n {
		name, err := pciaddr.DeviceName(fmt.Sprintf("0000:3b:%02x.%d", 2+i/8, i%8))
		if err != nil {
			t.Fatal(err)
		}
		names[i] = name
		claims = append(claims, preparetest.Claim("ns", fmt.Sprintf("c%02d", i), types.UID(fmt.Sprintf("uid-%02d", i)), []string{name},
			preparetest.Config(resourceapi.AllocationConfigSourceClaim, fmt.Sprintf(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":%d,"mac":"02:00:00:00:02:%02x"}`, i+1, i))))
	}
	for i := range dup {
		claims = append(claims, preparetest.Claim("ns", fmt.Sprintf("dup%02d", i), types.UID(fmt.Sprintf("uid-dup-%02d", i)), []string{names[i]}))
	}
	for _, c := range claims {
		e.AddClaim(t, c)
	}
	storm := func(f func(i int, c *resourceapi.ResourceClaim) error) map[string]error {
		var mu sync.Mutex
		errs := map[string]error{}
		var wg sync.WaitGroup
		for i, c := range claims {
			wg.Go(func() {
				err := f(i, c)
				mu.Lock()
				errs[c.Name] = err
				mu.Unlock()
			})
		}
		wg.Wait()
		return errs
	}

	// Claim i through instance i%2; its rival (dup i) through the other.
	errs := storm(func(i int, c *resourceapi.ResourceClaim) error { return tryPrepare(inst[i%2], c) })
	winners := map[string]bool{}
	for i := range n {
		own := errs[fmt.Sprintf("c%02d", i)]
		if i >= dup {
			if own != nil {
				t.Fatalf("c%02d: %v", i, own)
			}
			winners[claims[i].Name] = true
			continue
		}
		rival := errs[fmt.Sprintf("dup%02d", i)]
		if (own == nil) == (rival == nil) {
			t.Fatalf("VF %s: c%02d got %v, dup%02d got %v; exactly one must win", names[i], i, own, i, rival)
		}
		loser := own
		if loser == nil {
			loser = rival
			winners[claims[i].Name] = true
		} else {
			winners[claims[n+i].Name] = true
		}
		if !strings.Contains(loser.Error(), "is already prepared for claim ns/") {
			t.Fatalf("the loser's error does not name the holder: %v", loser)
		}
	}
	snap := e.Snapshot(t)
	vfio := 0
	for _, v := range snap.VFs {
		if v.Driver == "vfio-pci" {
			vfio++
		}
	}
	if got := claimUIDs(inst[0]); vfio != n || len(got) != n {
		t.Fatalf("%d VFs on vfio-pci, checkpoint holds %d claims; want %d each", vfio, len(got), n)
	}

	// Repeated prepares through the other instance (a kubelet retry that
	// lands there) change nothing; then everything is unprepared through
	// the instance that did not prepare it (losers too: unknown claims are
	// not an error).
	errs = storm(func(i int, c *resourceapi.ResourceClaim) error {
		if !winners[c.Name] {
			return nil
		}
		return tryPrepare(inst[(i+1)%2], c)
	})
	for name, err := range errs {
		if err != nil {
			t.Fatalf("repeated prepare of %s through the other instance: %v", name, err)
		}
	}
	if got := e.Snapshot(t); got.String() != snap.String() {
		t.Fatalf("repeated prepares changed the host:\n%s\nwant\n%s", got, snap)
	}
	errs = storm(func(i int, c *resourceapi.ResourceClaim) error { return tryUnprepare(inst[(i+1)%2], c) })
	for name, err := range errs {
		if err != nil {
			t.Fatalf("unprepare %s: %v", name, err)
		}
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after the storm:\n%s\nwant\n%s", got, before)
	}
	if got := claimUIDs(inst[1]); len(got) != 0 {
		t.Fatalf("checkpoint keeps %v", got)
	}
}
