package prepare

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// 64 claims prepared and unprepared concurrently through the gRPC API, with
// the helper's serialization off so the State itself sees the concurrency.
// 16 more claims race for VFs the first 64 also want: per VF exactly one
// claim may win. Run with -race.
func TestConcurrentClaimsOverGRPC(t *testing.T) {
	t.Parallel()
	const n, dup = 64, 16
	spec := simhost.Spec{PFs: []simhost.PFSpec{simhost.E810PF("0000:3b:00.0", "enp59s0f0", n)}}
	e := preparetest.NewEnv(t, shortDir(t), spec)
	before := e.Snapshot(t)
	state := e.NewState(t, nil)
	_, kl := preparetest.StartPlugin(t, e, state, kubeletplugin.Serialize(false))

	names := make([]string, n)
	claims := make([]*resourceapi.ResourceClaim, 0, n+dup)
	for i := range n {
		bdf := fmt.Sprintf("0000:3b:%02x.%d", 2+(i/8), i%8)
		name, err := pciaddr.DeviceName(bdf)
		if err != nil {
			t.Fatal(err)
		}
		names[i] = name
		c := preparetest.Claim("ns", fmt.Sprintf("c%02d", i), types.UID(fmt.Sprintf("uid-%02d", i)), []string{name},
			preparetest.Config("FromClaim", fmt.Sprintf(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":%d,"mac":"02:00:00:00:01:%02x"}`, i+1, i)))
		e.AddClaim(t, c)
		claims = append(claims, c)
	}
	for i := range dup {
		c := preparetest.Claim("ns", fmt.Sprintf("dup%02d", i), types.UID(fmt.Sprintf("uid-dup-%02d", i)), []string{names[i]})
		e.AddClaim(t, c)
		claims = append(claims, c)
	}

	call := func(prepare bool) map[string]string {
		var mu sync.Mutex
		errs := map[string]string{}
		var wg sync.WaitGroup
		for _, c := range claims {
			wg.Go(func() {
				var msg string
				if prepare {
					resp, err := kl.DRA.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
					if err != nil {
						msg = "rpc: " + err.Error()
					} else {
						msg = resp.Claims[string(c.UID)].Error
					}
				} else {
					resp, err := kl.DRA.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
					if err != nil {
						msg = "rpc: " + err.Error()
					} else {
						msg = resp.Claims[string(c.UID)].Error
					}
				}
				mu.Lock()
				errs[c.Name] = msg
				mu.Unlock()
			})
		}
		wg.Wait()
		return errs
	}

	errs := call(true)
	for i := range n {
		own, rival := errs[fmt.Sprintf("c%02d", i)], ""
		if i < dup {
			rival = errs[fmt.Sprintf("dup%02d", i)]
			if (own == "") == (rival == "") {
				t.Fatalf("VF %s: claim c%02d error %q, rival dup%02d error %q; exactly one must win", names[i], i, own, i, rival)
			}
			loser := own + rival
			if !strings.Contains(loser, "is already prepared for claim ns/") {
				t.Fatalf("loser's error does not name the holder: %q", loser)
			}
			continue
		}
		if own != "" {
			t.Fatalf("c%02d: %s", i, own)
		}
	}
	snap := e.Snapshot(t)
	vfio := 0
	for _, v := range snap.VFs {
		if v.Driver == "vfio-pci" {
			vfio++
		}
	}
	specs := 0 // ours; the helper writes a metadata spec per claim next to them
	for _, f := range snap.CDIFiles {
		if strings.HasPrefix(f, "sriov.vfnet.io-vf_") {
			specs++
		}
	}
	if vfio != n || len(state.Snapshot().Claims) != n || specs != n {
		t.Fatalf("%d VFs on vfio-pci, %d claims in the checkpoint, %d CDI specs; want %d each", vfio, len(state.Snapshot().Claims), specs, n)
	}

	for name, msg := range call(false) {
		if msg != "" {
			t.Fatalf("unprepare %s: %s", name, msg)
		}
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}
