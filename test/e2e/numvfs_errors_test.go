package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// claimsListPath is the cluster-wide ResourceClaims list, which only the VF
// count reconciler asks for (prepare gets single claims by name).
const claimsListPath = "/apis/resource.k8s.io/v1/resourceclaims"

// faultProxy fails the driver's cluster-wide ResourceClaims list (an
// apiProxy) while a fault is set: "unavailable" answers it 503 as an
// overloaded API server does, "slow" holds it without an answer until the
// client gives up. Every other request passes.
type faultProxy struct {
	*apiProxy
	lists atomic.Int32 // cluster-wide claim lists the driver sent

	mu    sync.Mutex
	fault string
}

func startFaultProxy(t *testing.T, plane *controlplane.Plane) *faultProxy {
	t.Helper()
	p := &faultProxy{}
	p.apiProxy = startAPIProxy(t, plane, p.intercept)
	return p
}

func (p *faultProxy) set(fault string) {
	p.mu.Lock()
	p.fault = fault
	p.mu.Unlock()
}

func (p *faultProxy) intercept(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet || r.URL.Path != claimsListPath || r.URL.Query().Get("watch") == "true" {
		return false
	}
	p.lists.Add(1)
	p.mu.Lock()
	fault := p.fault
	p.mu.Unlock()
	switch fault {
	case "unavailable":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable, Message: "the server is currently unable to handle the request"})
		return true
	case "slow":
		<-r.Context().Done() // the driver's timeout, or the proxy closing
		return true
	}
	return false
}

// nodeEvent waits for an Event on node with reason whose message holds
// every one of want, and returns the message.
func nodeEvent(ctx context.Context, env *flow.Env, n *flow.Node, reason string, want ...string) (string, error) {
	var msg string
	seen := map[string]bool{}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
	next:
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != n.Name || ev.Reason != reason {
				continue
			}
			seen[ev.Message] = true
			for _, w := range want {
				if !strings.Contains(ev.Message, w) {
					continue next
				}
			}
			msg = ev.Message
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		var got []string
		for m := range seen {
			got = append(got, m)
		}
		return "", fmt.Errorf("no %s Event on Node %s holding %q: %w (saw %q)", reason, n.Name, want, err, got)
	}
	return msg, nil
}

// pfNumVFs reads the simulated PF's sriov_numvfs and virtfn links.
func pfNumVFs(ctx context.Context, n *flow.Node, addr string) (int, int, error) {
	pfs, err := n.Host.Sysfs().Discover(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, pf := range pfs {
		if pf.Address == addr {
			return pf.NumVFs, len(pf.VFs), nil
		}
	}
	return 0, 0, fmt.Errorf("node %s: no PF %s in the simulated host", n.Name, addr)
}

// TestNumVFsWaitsWhileClaimsCannotBeListed runs the real driver (its
// ServiceAccount, token and RBAC) against the real API server, through a
// fault-injecting proxy, and asks a PF for fewer VFs three times while the
// driver cannot list ResourceClaims: the API server answers 503, the
// driver's ClusterRole lacks the list verb, the list gets no answer within
// --claims-list-timeout. Each time the change waits (sriov_numvfs kept,
// the PF's VFs published tainted), the driver says why (log line, Blocked
// Event on the Node naming the error and its fix), stays up, and prepares a
// claim on the other PF meanwhile; once the fault is gone the change is
// made. Before the fix the driver died of a nil pointer dereference here,
// and started again into the same crash.
func TestNumVFsWaitsWhileClaimsCannotBeListed(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	install(ctx, t, env)
	proxy := startFaultProxy(t, env.Plane)
	spec := simhost.E810Host()
	spec.PFs[0].NumVFs, spec.PFs[1].NumVFs = 4, 3
	const pf0 = "0000:3b:00.0" // enp59s0f0, physnet-a, the PF whose count changes
	n, _ := startNode(ctx, t, env, flow.NodeOptions{Name: "node-a", Spec: spec, NodeConfig: fmt.Sprintf(numVFsConfig, 4),
		ExtraDriverArgs: []string{"--vf-count-retry-interval=1s", "--claims-list-timeout=2s"},
		DriverAPIServer: proxy.endpoint()}, 7)

	roles := env.Client.RbacV1().ClusterRoles()
	// setClaimList takes the list verb on resourceclaims from the driver's
	// ClusterRole as applied from manifests/, or gives it back.
	setClaimList := func(allow bool) error {
		cr, err := roles.Get(ctx, flow.ServiceAccount, metav1.GetOptions{})
		if err != nil {
			return err
		}
		found := false
		for i, r := range cr.Rules {
			if !slices.Equal(r.APIGroups, []string{"resource.k8s.io"}) || !slices.Equal(r.Resources, []string{"resourceclaims"}) {
				continue
			}
			found = true
			verbs := slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "list" })
			if allow {
				verbs = append(verbs, "list")
			}
			cr.Rules[i].Verbs = verbs
		}
		if !found {
			return fmt.Errorf("ClusterRole %s has no rule for resourceclaims: %+v", cr.Name, cr.Rules)
		}
		_, err = roles.Update(ctx, cr, metav1.UpdateOptions{})
		return err
	}
	// The rule as applied, to compare after the forbidden case.
	applied, err := roles.Get(ctx, flow.ServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	cur := 4
	for i, c := range []struct {
		name    string
		on, off func() error
		// says are in the reason beyond the listing failure; the last one
		// also in the log (klog quotes the error: no quotes in it).
		says []string
	}{
		{"API server answers 503", func() error { proxy.set("unavailable"); return nil }, func() error { proxy.set(""); return nil },
			[]string{"the server is currently unable to handle the request", "check that the API server is up"}},
		{"ClusterRole lacks list on resourceclaims", func() error { return setClaimList(false) }, func() error { return setClaimList(true) },
			[]string{`cannot list resource "resourceclaims" in API group "resource.k8s.io" at the cluster scope`, "needs the verb list on resourceclaims", "vfnet-driver ClusterRole (manifests/base/rbac.yaml)"}},
		{"list gets no answer", func() error { proxy.set("slow"); return nil }, func() error { proxy.set(""); return nil },
			[]string{"no answer within 2s (--claims-list-timeout)", "context deadline exceeded"}},
	} {
		want := cur - 1
		t.Logf("==> %s: numVFs %d -> %d", c.name, cur, want)
		start := time.Now()
		if err := c.on(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lists := proxy.lists.Load()
		if err := os.WriteFile(n.NodeConfig, []byte(fmt.Sprintf(numVFsConfig, want)), 0o644); err != nil {
			t.Fatal(err)
		}
		msg, err := nodeEvent(ctx, env, n, vfcount.ReasonBlocked, append([]string{
			fmt.Sprintf("PF %s (enp59s0f0): waiting to replace its %d VFs by %d", pf0, cur, want),
			fmt.Sprintf("sriov_numvfs %d -> 0 -> %d", cur, want),
			"ResourceClaims cannot be listed, so whether a claim is allocated one of its VFs is unknown",
			"the change is made once they can be listed"}, c.says...)...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, n.DriverLog(4000))
		}
		t.Logf("Node Event after %v: %s", time.Since(start).Round(100*time.Millisecond), msg)

		// Prepares go on: a VM on the other PF gets its VF.
		vm, err := env.CreateVM(ctx, flow.VMSpec{Name: fmt.Sprintf("vm-%d", i), DeviceClass: "vfnet-physnet-b", MAC: fmt.Sprintf("02:00:00:00:0e:%02x", i+1)})
		if err != nil {
			t.Fatal(err)
		}
		sched, err := env.WaitScheduled(ctx, vm, time.Minute)
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, n.DriverLog(4000))
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = n.Kubelet.WaitPrepared(wctx, vm.Pod.UID)
		cancel()
		if err != nil {
			t.Fatalf("%s: claim %s not prepared while the claims cannot be listed: %v\n%s", c.name, sched.Claim.Name, err, n.DriverLog(4000))
		}
		ref, err := env.Ref(ctx, n.Name, sched.Device.Device)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := n.VFState(ref); err != nil || st.Driver != "vfio-pci" || ref.PFName != "enp59s0f1" {
			t.Fatalf("%s: prepared VF %+v on driver %q (%v); want a VF of enp59s0f1 on vfio-pci", c.name, ref, st.Driver, err)
		}

		// Still waiting after further passes, each of which lists the
		// claims again and would have made the change.
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return proxy.lists.Load()-lists >= 3, nil
		})
		if err != nil {
			t.Fatalf("%s: the driver listed the claims %d times while it waited; want a retry every pass: %v\n%s", c.name, proxy.lists.Load()-lists, err, n.DriverLog(4000))
		}
		if got, links, err := pfNumVFs(ctx, n, pf0); err != nil || got != cur || links != cur {
			t.Fatalf("%s: PF %s has sriov_numvfs %d, %d VFs (%v) while the claims cannot be listed; want %d kept", c.name, pf0, got, links, err, cur)
		}
		if taints, err := countTaints(ctx, env, n.Name); err != nil || len(taints) != cur {
			t.Fatalf("%s: physnet-a devices %v (%v), want %d", c.name, taints, err, cur)
		} else {
			for d, v := range taints {
				if v == "" {
					t.Errorf("%s: device %s of the waiting PF published without the %s taint", c.name, d, vfcount.TaintKey)
				}
			}
		}
		if err := n.DriverRunning(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		log := n.DriverLog(64 << 20)
		for _, w := range []string{"Cannot list ResourceClaims; VF count changes wait", "VF count change waits until ResourceClaims can be listed", c.says[len(c.says)-1]} {
			if !strings.Contains(log, w) {
				t.Errorf("%s: driver log lacks %q", c.name, w)
			}
		}

		if err := c.off(); err != nil {
			t.Fatalf("%s: remove the fault: %v", c.name, err)
		}
		fixed := time.Now()
		// While the change runs, sysfs passes through 0 VFs and a PF whose
		// sriov_numvfs is being written (discovery skips it), and the API
		// server's slices lag: a read that fails is a state to wait out.
		var last error
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, links, err := pfNumVFs(ctx, n, pf0)
			if err != nil || got != want || links != want {
				last = fmt.Errorf("PF reads %d VFs, %d links (%v)", got, links, err)
				return false, nil
			}
			taints, err := countTaints(ctx, env, n.Name)
			if err != nil || len(taints) != want {
				last = fmt.Errorf("%d published VFs with a count taint entry (%v)", len(taints), err)
				return false, nil
			}
			for _, v := range taints {
				if v != "" {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s: fault removed, PF %s not at %d untainted VFs: %v (last: %v)\n%s", c.name, pf0, want, err, last, n.DriverLog(4000))
		}
		t.Logf("measured: %s: fault removed -> %d VFs published untainted: %v", c.name, want, time.Since(fixed).Round(100*time.Millisecond))
		cur = want
	}

	after, err := roles.Get(ctx, flow.ServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !sameRules(applied.Rules, after.Rules) {
		t.Errorf("ClusterRole not restored: %+v, applied %+v", after.Rules, applied.Rules)
	}
	if err := n.DriverRunning(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(n.DriverLog(64<<20), "panic") {
		t.Errorf("driver log shows a panic:\n%s", n.DriverLog(4000))
	}
	// The same process ran throughout and stops cleanly.
	if err := n.StopDriver(false); err != nil {
		t.Fatal(err)
	}
}

// sameRules compares policy rules with verbs in any order.
func sameRules(a, b []rbacv1.PolicyRule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		va, vb := slices.Sorted(slices.Values(a[i].Verbs)), slices.Sorted(slices.Values(b[i].Verbs))
		if !slices.Equal(va, vb) || !slices.Equal(a[i].Resources, b[i].Resources) || !slices.Equal(a[i].APIGroups, b[i].APIGroups) ||
			!slices.Equal(a[i].ResourceNames, b[i].ResourceNames) {
			return false
		}
	}
	return true
}
