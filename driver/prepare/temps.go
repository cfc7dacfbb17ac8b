package prepare

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
)

// helperMetadataFile is the name of the kubeletplugin helper's metadata file
// in MetadataDirName/<namespace>_<name>/<request>/.
const helperMetadataFile = "metadata.json"

// removeClaimTemps removes the temporary files a kill inside one of the
// claim's file writes left: its CDI spec's (CDIWriter.removeTemps) and the
// kubeletplugin helper's for its metadata files and their CDI specs. Only
// files named after this claim are touched. It must run with no write of
// the claim's files in flight: the caller holds the node lock (no other
// prepare or unprepare), and the helper writes metadata only around our
// calls, under its own serialization lock. A file that cannot be removed is
// logged: it is harmless, and failing the call over it would keep the claim
// from being prepared or released.
func (s *State) removeClaimTemps(ctx context.Context, uid types.UID, namespace, name string) {
	logger := klog.FromContext(ctx)
	removed, err := s.cdi.removeTemps(uid)
	more, merr := s.removeMetadataTemps(uid, namespace, name)
	removed = append(removed, more...)
	for _, f := range removed {
		logger.V(2).Info("Removed a temporary file an interrupted write of the claim left behind", "file", f)
	}
	if err = errors.Join(err, merr); err != nil {
		logger.Error(err, "Could not remove every temporary file of the claim; they are harmless, remove them by hand (the driver also removes them at its next start once they are older than its stale-temp age)")
	}
}

// removeMetadataTemps removes the helper's temporary files for the claim's
// metadata: in the CDI directory
// .<driver>_metadata_<uid>_<request>.json.<digits>.tmp, and in the plugin
// directory MetadataDirName/<namespace>_<name>/<request>/.metadata.json.<digits>.tmp
// (names from kubeletplugin's metadata writer; TestHelperTempNamesAreRemoved
// pins them against it).
func (s *State) removeMetadataTemps(uid types.UID, namespace, name string) ([]string, error) {
	var (
		victims []string
		errs    []error
	)
	prefix := s.opts.DriverName + "_metadata_" + string(uid) + "_"
	specs, err := filepath.Glob(filepath.Join(checkpoint.GlobEscape(s.opts.CDIRoot), "."+checkpoint.GlobEscape(prefix)+"*.tmp"))
	if err != nil {
		errs = append(errs, fmt.Errorf("list temporary metadata CDI specs of claim %s in %s: %w", uid, s.opts.CDIRoot, err))
	}
	for _, p := range specs {
		// The request is a DNS label (no dots), which also keeps another
		// claim whose UID extends this one with "_..." from matching.
		req, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(p), "."+prefix), ".")
		if len(validation.IsDNS1123Label(req)) == 0 && isTempName(filepath.Base(p), prefix+req+".json") {
			victims = append(victims, p)
		}
	}
	if namespace != "" && name != "" {
		dir := filepath.Join(filepath.Dir(s.opts.CheckpointPath), MetadataDirName, namespace+"_"+name)
		files, err := filepath.Glob(filepath.Join(checkpoint.GlobEscape(dir), "*", checkpoint.TempGlob(helperMetadataFile)))
		if err != nil {
			errs = append(errs, fmt.Errorf("list temporary metadata files of claim %s/%s in %s: %w", namespace, name, dir, err))
		}
		for _, p := range files {
			if isTempName(filepath.Base(p), helperMetadataFile) {
				victims = append(victims, p)
			}
		}
	}
	var removed []string
	for _, p := range victims {
		switch err := os.Remove(p); {
		case err == nil:
			removed = append(removed, p)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("remove temporary metadata file %s: %w", p, err))
		}
	}
	return removed, errors.Join(errs...)
}
