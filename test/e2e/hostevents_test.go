package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// TestDriverFollowsHostEvents: with the periodic resync an hour away, the
// published ResourceSlices follow the host anyway, because the driver
// listens: a sriov_numvfs write by hand (uevents), a PF's link going down
// (a link notification) and an edit of the node configuration file
// (inotify). Each publish logs the events that caused it.
func TestDriverFollowsHostEvents(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	install(ctx, t, env)
	n, _ := startNode(ctx, t, env, flow.NodeOptions{Name: "node-a", Spec: flow.DemoHost(),
		ExtraDriverArgs: []string{"--resync-interval=1h", "--health-interval=1h", "-v=2"}}, 3)
	pf0 := n.Host.Spec().PFs[0] // enp59s0f0, physnet-a, 2 VFs

	// An admin writes sriov_numvfs by hand: 2 -> 0 -> 1.
	t0 := time.Now()
	if err := n.Host.SetNumVFs(pf0.Address, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitSlices(ctx, n.Name, 2, time.Minute); err != nil {
		t.Fatalf("after sriov_numvfs 1 by hand: %v", err)
	}
	t.Logf("measured: sriov_numvfs written -> slices in the API: %v", time.Since(t0).Round(10*time.Millisecond))

	// The cable of physnet-a's PF is pulled.
	t0 = time.Now()
	if err := n.Host.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	refs, err := env.WaitSlices(ctx, n.Name, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var vf string
	for _, r := range refs {
		if r.PFName == "enp59s0f0" {
			vf = r.Device
		}
	}
	waitTaints(ctx, t, env, n, map[string]string{vf: "link-down"})
	t.Logf("measured: link down -> VF tainted in the API: %v", time.Since(t0).Round(10*time.Millisecond))
	// The health monitor may taint first; the link event's own rescan
	// follows. Let it happen before the file changes: a config change in
	// the same burst makes the rescan a full one, which is right but not
	// what this test checks.
	linkRescan := regexp.MustCompile(`"Rescan" cause="host events: [^"]*link new enp59s0f0 down`)
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return linkRescan.MatchString(n.DriverLog(1 << 20)), nil
	}); err != nil {
		t.Fatalf("no rescan for the link event within a minute: %v\n%s", err, n.DriverLog(6000))
	}

	// The node configuration loses physnet-b, replaced the way the kubelet
	// updates a ConfigMap volume: a new file renamed over the old one.
	cfg, err := os.ReadFile(n.NodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	edited := regexp.MustCompile(`(?m)^- pfName: enp59s0f1\n  network: physnet-b\n`).ReplaceAllString(string(cfg), "")
	if edited == string(cfg) {
		t.Fatalf("the node configuration has no physnet-b entry to remove:\n%s", cfg)
	}
	t0 = time.Now()
	tmp := filepath.Join(filepath.Dir(n.NodeConfig), ".node-config.tmp")
	if err := os.WriteFile(tmp, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, n.NodeConfig); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitSlices(ctx, n.Name, 1, time.Minute); err != nil {
		t.Fatalf("after the node configuration dropped physnet-b: %v", err)
	}
	t.Logf("measured: node configuration replaced -> slices in the API: %v", time.Since(t0).Round(10*time.Millisecond))

	// Every rescan was caused by host events, none by the resync, and each
	// names its causes (-v=2 logs each rescan; a publish carries the cause
	// of the rescan that made it, which for the taint may be the health
	// monitor's republish the link event led to).
	log := n.DriverLog(1 << 20)
	var causes []string
	for _, line := range strings.Split(log, "\n") {
		if m := regexp.MustCompile(`"Rescan" cause="([^"]*)"`).FindStringSubmatch(line); m != nil {
			causes = append(causes, m[1])
		}
	}
	t.Logf("rescans and their causes:\n  %s", strings.Join(causes, "\n  "))
	for _, want := range []string{"uevent change pci " + pf0.Address, "link new enp59s0f0 down", "config"} {
		found := false
		for _, c := range causes {
			if strings.HasPrefix(c, "host events: ") && strings.Contains(c, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("no rescan caused by host events naming %q; causes:\n%s", want, strings.Join(causes, "\n"))
		}
	}
	for _, c := range causes {
		if c == "resync" {
			t.Errorf("a rescan was caused by the resync, which is an hour away")
		}
	}
	// The kernel's events name the PF: only it is reread. The file's
	// change may concern any PF: the whole host is.
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`"Rescan" cause="host events: [^"]*uevent change pci ` + regexp.QuoteMeta(pf0.Address) + `[^"]*" pfs=\[("[^"]*",)*"` + regexp.QuoteMeta(pf0.Address) + `"`),
		regexp.MustCompile(`"Rescan" cause="host events: [^"]*link new enp59s0f0 down[^"]*" pfs=\[("[^"]*",)*"` + regexp.QuoteMeta(pf0.Address) + `"`),
		regexp.MustCompile(`"Rescan" cause="host events: [^"]*config [^"]*"\s*$`),
	} {
		found := false
		for _, line := range strings.Split(log, "\n") {
			if want.MatchString(line) {
				found = true
			}
		}
		if !found {
			t.Errorf("no driver log line matching %s", want)
		}
	}
}
