package prepare_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/driver/preparetest"
	"github.com/vfnet-io/vfnet/pkg/simhost"
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
