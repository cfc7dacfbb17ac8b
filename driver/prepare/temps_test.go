package prepare_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

// A crash inside a file write leaves a temporary file. A starting driver
// removes ours (its checkpoint and CDI specs, and the kubeletplugin
// helper's metadata files and specs) once they are older than
// StaleTempAge; younger ones may be the other instance's write in progress
// during a rolling update, and other names are not ours.
func TestStartRemovesStaleTemps(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	meta := filepath.Join(e.PluginDir, prepare.MetadataDirName, "ns_a", "vf")
	if err := os.MkdirAll(meta, 0o755); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Base(e.CheckpointPath())
	files := map[string]bool{ // path -> removed at start-up
		// Ours, left by crashes an hour ago.
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_uid-a.json.1234.tmp"):          true,
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_uid-a.json.validate"):          true,
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io_metadata_uid-a_vf.json.2345.tmp"): true,
		filepath.Join(e.PluginDir, "."+cp+".3456.tmp"):                              true,
		filepath.Join(meta, ".metadata.json.4567.tmp"):                              true,
		// Ours, but written just now: another instance's write in flight.
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_uid-b.json.5678.tmp#fresh"):          false,
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io_metadata_uid-b_vf.json.6789.tmp#fresh"): false,
		filepath.Join(e.PluginDir, "."+cp+".7890.tmp#fresh"):                              false,
		filepath.Join(meta, ".metadata.json.8901.tmp#fresh"):                              false,
		// Old, but not temporaries of ours.
		filepath.Join(e.CDIRoot, ".nvidia.com-gpu_uid-c.json.9012.tmp"):   false,
		filepath.Join(e.CDIRoot, "sriov.vfnet.io-vf_uid-d.json"):          false,
		filepath.Join(e.CDIRoot, "sriov.vfnet.io_metadata_uid-d_vf.json"): false,
		filepath.Join(meta, "metadata.json"):                              false,
		filepath.Join(e.PluginDir, ".other.json.0123.tmp"):                false,
	}
	old := time.Now().Add(-time.Hour)
	paths := map[string]bool{}
	for spec, stale := range files {
		p, fresh := spec, false
		if n := len(p) - len("#fresh"); n > 0 && p[n:] == "#fresh" {
			p, fresh = p[:n], true
		}
		paths[p] = stale
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		if !fresh {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	opts := e.Options(nil)
	opts.StaleTempAge = time.Minute
	if _, err := prepare.New(opts); err != nil {
		t.Fatal(err)
	}
	for p, stale := range paths {
		_, err := os.Stat(p)
		if gone := errors.Is(err, os.ErrNotExist); gone != stale {
			t.Errorf("%s: removed %v, want %v", p, gone, stale)
		}
	}
	// Loading the checkpoint (every call does) removes nothing.
	if _, err := (checkpoint.Store{Path: e.CheckpointPath()}).Load(); err != nil {
		t.Fatal(err)
	}
	for p, stale := range paths {
		if _, err := os.Stat(p); !stale && err != nil {
			t.Errorf("%s removed by a checkpoint load: %v", p, err)
		}
	}
}

// claimTemps are the temporary files a kill inside each of a claim's file
// writes leaves (request "vf"): its CDI spec's (and the validation copy
// older drivers wrote), and the kubeletplugin helper's for the metadata
// file and the metadata's CDI spec.
func claimTemps(e *preparetest.Env, c *resourceapi.ResourceClaim) []string {
	uid := string(c.UID)
	return []string{
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_"+uid+".json.1234.tmp"),
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_"+uid+".json.validate"),
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io_metadata_"+uid+"_vf.json.2345.tmp"),
		filepath.Join(e.PluginDir, prepare.MetadataDirName, c.Namespace+"_"+c.Name, "vf", ".metadata.json.3456.tmp"),
	}
}

// Unprepare removes the temporary files of the claim it unprepares, just
// written (younger than the start-up sweep's age), and nothing of another
// claim; each removal is logged at V(2) with the claim.
func TestUnprepareRemovesTheClaimsTemps(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	a := preparetest.Claim("ns", "a", "uid-a", []string{vf1})
	b := preparetest.Claim("ns", "b", "uid-b", []string{"vf-0000-3b-02-2"})
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		e.AddClaim(t, c)
	}
	s := e.NewState(t, nil)
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if r := prepareOne(t, s, c); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	tempsA, tempsB := claimTemps(e, a), claimTemps(e, b)
	kept := append(slices.Clone(tempsB),
		// Final files: the helper removes the metadata, Remove the spec.
		filepath.Join(e.PluginDir, prepare.MetadataDirName, "ns_a", "vf", "metadata.json"),
		filepath.Join(e.CDIRoot, "sriov.vfnet.io_metadata_uid-a_vf.json"),
		// Look-alikes of claims whose UIDs extend uid-a.
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io_metadata_uid-a_x_vf.json.1.tmp"),
		filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_uid-a0.json.1.tmp"),
		// Not a temporary file name of the helper's.
		filepath.Join(e.PluginDir, prepare.MetadataDirName, "ns_a", "vf", ".metadata.json.x.tmp"),
	)
	for _, p := range append(slices.Clone(tempsA), kept...) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var buf syncbuf.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(2))))
	res, err := s.Unprepare(ctx, []kubeletplugin.NamespacedObject{{UID: a.UID, NamespacedName: types.NamespacedName{Namespace: a.Namespace, Name: a.Name}}})
	if err != nil || res[a.UID] != nil {
		t.Fatal(err, res[a.UID])
	}
	for _, p := range tempsA {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of the unprepared claim is still there (%v)", p, err)
		}
		logged := false
		for _, l := range strings.Split(buf.String(), "\n") {
			logged = logged || strings.Contains(l, `"Removed a temporary file an interrupted write of the claim left behind"`) &&
				strings.Contains(l, `claim="ns/a"`) && strings.Contains(l, `file="`+p+`"`)
		}
		if !logged {
			t.Errorf("removal of %s not logged with the claim; log:\n%s", p, buf.String())
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("unprepare of ns/a removed %s: %v", p, err)
		}
	}

	if err := unprepareOne(t, s, b); err != nil {
		t.Fatal(err)
	}
	for _, p := range tempsB {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of the unprepared claim ns/b is still there (%v)", p, err)
		}
	}
}

// A prepare that goes on after a kill inside one of the claim's writes
// removes what the kill left, so the prepared claim has only its own files.
func TestPrepareAgainRemovesTheClaimsTemps(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	a := preparetest.Claim("ns", "a", "uid-a", []string{vf1})
	b := preparetest.Claim("ns", "b", "uid-b", []string{"vf-0000-3b-02-2"})
	e.AddClaim(t, a)
	// The first prepare stops inside the CDI spec write, as under a kill.
	first := e.NewState(t, func(step string) {
		if step == prepare.StepCDITempWritten {
			runtime.Goexit() // deferred calls run: only the node lock's release
		}
	})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_, _ = first.Prepare(context.Background(), []*resourceapi.ResourceClaim{a})
	}()
	<-stopped
	left, err := filepath.Glob(filepath.Join(e.CDIRoot, ".sriov.vfnet.io-vf_uid-a.json.*.tmp"))
	if err != nil || len(left) != 1 {
		t.Fatalf("after a kill inside the CDI write: temporary files %v (%v), want one", left, err)
	}
	tempsA, tempsB := claimTemps(e, a), claimTemps(e, b)
	for _, p := range append(slices.Clone(tempsA), tempsB...) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if r := prepareOne(t, e.NewState(t, nil), a); r.Err != nil {
		t.Fatal(r.Err)
	}
	for _, p := range append(left, tempsA...) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the claim was prepared again (%v)", p, err)
		}
	}
	for _, p := range tempsB {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("prepare of ns/a removed %s of ns/b: %v", p, err)
		}
	}
}
