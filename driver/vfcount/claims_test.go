package vfcount_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// claimsAPI serves the cluster-wide ResourceClaims list over HTTP as
// kube-apiserver does (Status bodies for errors), for APIAllocated's real
// client: "ok" lists claims, "unavailable" answers 503, "forbidden" 403
// with the RBAC message, "slow" never answers.
type claimsAPI struct {
	srv     *httptest.Server
	release chan struct{}
	lists   atomic.Int32

	mu     sync.Mutex
	mode   string
	claims []resourceapi.ResourceClaim
}

func newClaimsAPI(t *testing.T) *claimsAPI {
	t.Helper()
	a := &claimsAPI{mode: "ok", release: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(func() {
		close(a.release) // a slow list still open must not hold Close
		a.srv.Close()
	})
	return a
}

func (a *claimsAPI) set(mode string) {
	a.mu.Lock()
	a.mode = mode
	a.mu.Unlock()
}

func (a *claimsAPI) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: a.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func status(code int, reason metav1.StatusReason, msg string) *metav1.Status {
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg}
}

func (a *claimsAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != "/apis/resource.k8s.io/v1/resourceclaims" {
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource"))
		return
	}
	a.lists.Add(1)
	a.mu.Lock()
	mode, claims := a.mode, slices.Clone(a.claims)
	a.mu.Unlock()
	switch mode {
	case "unavailable":
		writeJSON(w, http.StatusServiceUnavailable, status(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the server is currently unable to handle the request"))
	case "forbidden":
		writeJSON(w, http.StatusForbidden, status(http.StatusForbidden, metav1.StatusReasonForbidden,
			`resourceclaims.resource.k8s.io is forbidden: User "system:serviceaccount:vfnet-system:vfnet-driver" cannot list resource "resourceclaims" in API group "resource.k8s.io" at the cluster scope`))
	case "slow":
		select {
		case <-r.Context().Done():
		case <-a.release:
		}
	default:
		writeJSON(w, http.StatusOK, &resourceapi.ResourceClaimList{
			TypeMeta: metav1.TypeMeta{Kind: "ResourceClaimList", APIVersion: "resource.k8s.io/v1"}, Items: claims})
	}
}

// allocatedClaim is a claim whose allocation names device of node-1's pool.
func allocatedClaim(ns, name, device string) resourceapi.ResourceClaim {
	return resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "vf", Driver: discovery.DriverName, Pool: "node-1", Device: device}},
		}}},
	}
}

// While the claims cannot be listed (the API server fails, the driver's
// RBAC lacks list, the list gets no answer) a change of a PF with VFs
// waits: nothing written, the VFs published tainted, the plan Blocked
// naming the list error and its fix, one Event. Once listing works again
// the change is made. Before the fix this panicked in Plan.
func TestListFailureWaits(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	for mode, want := range map[string][]string{
		"unavailable": {"the server is currently unable to handle the request", "check that the API server is up"},
		"forbidden":   {`cannot list resource "resourceclaims"`, "needs the verb list on resourceclaims", "vfnet-driver ClusterRole (manifests/base/rbac.yaml)"},
		"slow":        {"no answer within 500ms (--claims-list-timeout)", "context deadline exceeded"},
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n")
			api := newClaimsAPI(t)
			api.set(mode)
			e.list = vfcount.APIAllocated(api.client(t), discovery.DriverName, "node-1", timeout)
			for range 3 {
				start := time.Now()
				e.scan()
				if d := time.Since(start); d > timeout+5*time.Second {
					t.Fatalf("a scan took %v with the list bounded by %v", d, timeout)
				}
			}
			if n, links := e.numVFs(pf0); n != 4 || links != 4 || len(e.numvfsWrites(pf0)) != 0 {
				t.Fatalf("changed while the claims cannot be listed: sriov_numvfs %d, %d links, writes %q", n, links, e.numvfsWrites(pf0))
			}
			if got := api.lists.Load(); got < 3 {
				t.Errorf("%d lists in 3 scans: the list is not retried every pass", got)
			}
			if !e.rec.Waiting() {
				t.Error("not waiting: the loop would not retry at the pending interval")
			}
			pub := e.pub.last()
			if len(pub) != 4 {
				t.Fatalf("published %d devices, want the 4 VFs kept", len(pub))
			}
			for name, d := range pub {
				if countTaint(d) == "" {
					t.Errorf("device %s published without the count-change taint", name)
				}
			}
			evs := e.drainEvents()
			if len(evs) != 1 || !strings.Contains(evs[0], vfcount.ReasonBlocked) {
				t.Fatalf("events %q: want one %s", evs, vfcount.ReasonBlocked)
			}
			plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
			if len(plans) != 1 || plans[0].State != vfcount.Blocked || len(plans[0].Blockers) != 0 {
				t.Fatalf("plans %+v: want one blocked by the list alone", plans)
			}
			for _, w := range append([]string{"ResourceClaims cannot be listed", "whether a claim is allocated one of its VFs is unknown"}, want...) {
				if !strings.Contains(plans[0].Reason, w) {
					t.Errorf("reason %q lacks %q", plans[0].Reason, w)
				}
				if !strings.Contains(evs[0], w) {
					t.Errorf("event %q lacks %q", evs[0], w)
				}
			}

			api.set("ok")
			e.scan()
			if n, links := e.numVFs(pf0); n != 2 || links != 2 {
				t.Fatalf("listing works again: sriov_numvfs %d, %d links; want 2", n, links)
			}
			if w := e.numvfsWrites(pf0); !slices.Equal(w, []string{"0", "2"}) {
				t.Fatalf("writes %q, want 0 then 2", w)
			}
		})
	}
}

// What the API server lists decides, through APIAllocated's real client:
// a claim allocated a VF of node-1's pool blocks by name, one of another
// pool or driver does not.
func TestAPIAllocatedBlocks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n")
	api := newClaimsAPI(t)
	vf3 := devName(t, "0000:3b:02.3")
	other := allocatedClaim("vms", "elsewhere", vf3)
	other.Status.Allocation.Devices.Results[0].Pool = "node-2"
	api.claims = []resourceapi.ResourceClaim{allocatedClaim("vms", "vm-a-vf", vf3), other}
	e.list = vfcount.APIAllocated(api.client(t), discovery.DriverName, "node-1", 0)
	e.scan()
	e.scan()
	plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
	if len(plans) != 1 || plans[0].State != vfcount.Blocked || len(plans[0].Blockers) != 1 || plans[0].Blockers[0].Claim != "vms/vm-a-vf" {
		t.Fatalf("plans %+v: want blocked by vms/vm-a-vf alone", plans)
	}
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("changed under an allocated claim: %d VFs", n)
	}
}

// A list that gets no answer ends when the caller's context does, even
// with a long timeout: a stopping driver is not held up by it.
func TestSlowListHonoursContext(t *testing.T) {
	t.Parallel()
	api := newClaimsAPI(t)
	api.set("slow")
	list := vfcount.APIAllocated(api.client(t), discovery.DriverName, "node-1", time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := list(ctx)
	if d := time.Since(start); err == nil || d > 5*time.Second {
		t.Fatalf("list returned %v after %v; want an error soon after the context ends", err, d)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "list ResourceClaims") {
		t.Fatalf("error %q: want the list named and the context's end wrapped", err)
	}
}

// The last check before the write lists the claims under the node lock,
// which every prepare waits for: a list that gets no answer gives the lock
// back after the timeout, writes nothing, and says why (a Failed Event).
// The next pass with a working API server makes the change.
func TestSlowListUnderNodeLockIsBounded(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n")
	api := newClaimsAPI(t)
	e.list = vfcount.APIAllocated(api.client(t), discovery.DriverName, "node-1", timeout)
	e.scan() // publishes the taints; the write is due on the next pass
	plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
	if len(plans) != 1 || plans[0].State != vfcount.Pending {
		t.Fatalf("plans %+v: want pending", plans)
	}
	e.drainEvents()
	api.set("slow")
	before := api.lists.Load()
	start := time.Now()
	if e.rec.Apply(e.ctx, plans) {
		t.Fatal("Apply changed the PF without knowing the claims")
	}
	if d := time.Since(start); d < timeout || d > timeout+5*time.Second {
		t.Fatalf("Apply took %v; want the list's timeout %v", d, timeout)
	}
	if api.lists.Load() == before {
		t.Fatal("Apply did not list the claims under the lock")
	}
	if !e.nodeLock.TryLock() {
		t.Fatal("node lock still held after Apply")
	}
	e.nodeLock.Unlock()
	if n, _ := e.numVFs(pf0); n != 4 || len(e.numvfsWrites(pf0)) != 0 {
		t.Fatalf("wrote without knowing the claims: %d VFs, writes %q", n, e.numvfsWrites(pf0))
	}
	evs := e.drainEvents()
	if len(evs) != 1 || !strings.Contains(evs[0], vfcount.ReasonFailed) || !strings.Contains(evs[0], "no answer within 500ms") ||
		!strings.Contains(evs[0], "not changing them until ResourceClaims can be listed") {
		t.Fatalf("events %q: want one %s naming the list's timeout", evs, vfcount.ReasonFailed)
	}
	api.set("ok")
	e.scan()
	if n, links := e.numVFs(pf0); n != 2 || links != 2 {
		t.Fatalf("API answers again: sriov_numvfs %d, %d links; want 2", n, links)
	}
}

// A PF without VFs has none a claim could hold: it gets its VFs although
// the claims cannot be listed.
func TestCreateFromZeroWhileListFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.MixedHost(), "pfs:\n- pfName: enp59s0f1\n  network: physnet-b\n  numVFs: 3\n")
	api := newClaimsAPI(t)
	api.set("unavailable")
	e.list = vfcount.APIAllocated(api.client(t), discovery.DriverName, "node-1", 0)
	e.scan()
	if n, links := e.numVFs(pf1); n != 3 || links != 3 {
		t.Fatalf("sriov_numvfs %d, %d links; want 3", n, links)
	}
}
