package prepare

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A kill inside one of a claim's file writes leaves a temporary file; the
// restarted driver's unprepare of the claim must leave no file of it. The
// writes of one prepare through the kubelet plugin: vfnet's CDI spec, and
// per request the helper's metadata file and its CDI spec.

// modePluginPrepare prepares crashClaim through the kubelet plugin (the
// helper writes the metadata) and SIGKILLs itself inside the crashAt-th
// file write.
const modePluginPrepare = "plugin-prepare"

// TestWriteCrashChildProcess is the child process of TestKillInsideEveryWrite; it
// does nothing in a normal run.
func TestWriteCrashChildProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" || os.Getenv(envMode) != modePluginPrepare {
		t.Skip("helper process for TestKillInsideEveryWrite")
	}
	crashAt, _ := strconv.Atoi(os.Getenv(envCrashAt))
	h, err := simhost.Open(os.Getenv(envHostRoot))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(os.Getenv(envClaim))
	if err != nil {
		t.Fatal(err)
	}
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(data, &claim); err != nil {
		t.Fatal(err)
	}
	writes := 0
	// killInside is called inside each write, once its temporary file is
	// complete and before the rename.
	killInside := func(step string) {
		writes++
		if writes == crashAt {
			_ = os.WriteFile(os.Getenv(envStepFile), []byte(step), 0o644)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	e := &preparetest.Env{Dir: filepath.Dir(os.Getenv(envClaim)), Host: h, Kube: fake.NewClientset(&claim),
		PluginDir: os.Getenv(envPluginDir), CDIRoot: os.Getenv(envCDIRoot)}
	s, err := prepare.New(prepare.Options{
		NodeName: preparetest.Node, Sysfs: h.Sysfs(), Writer: h.Kernel(), Links: h.Links(), DevRoot: h.DevRoot(),
		CheckpointPath: e.CheckpointPath(), CDIRoot: e.CDIRoot, Kube: e.Kube,
		Hook: func(step string) {
			if step == prepare.StepCDITempWritten {
				killInside(step)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The helper's own write cannot be stopped half-way, so the child
	// writes the metadata the way it does (os.CreateTemp beside the file,
	// then rename) and stops in between; TestHelperTempNamesAreRemoved
	// checks unprepare removes the names the helper's real write uses.
	write := func(name string, data []byte, perm os.FileMode) error {
		tmp, err := os.CreateTemp(filepath.Dir(name), checkpoint.TempGlob(filepath.Base(name)))
		if err != nil {
			return err
		}
		_, err = tmp.Write(data)
		if err == nil {
			err = tmp.Chmod(perm)
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(e.Dir, name)
		killInside("metadata write " + rel)
		return os.Rename(tmp.Name(), name)
	}
	_, kubelet := preparetest.StartPlugin(t, e, s, kubeletplugin.MetadataFileOps(kubeletplugin.MetadataFileOperations{WriteFile: write}))
	resp, err := kubelet.DRA.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(&claim)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("prepare through the plugin: %+v", r)
	}
}

// TestKillInsideEveryWrite kills the driver inside each file write of a
// prepare through the kubelet plugin; the restarted driver then unprepares
// the claim through the plugin, and afterwards neither the CDI directory
// nor the metadata directory holds a file of the claim, and the host is as
// it was.
func TestKillInsideEveryWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	t.Parallel()
	c := crashClaim()
	var steps []string
	// A prepare through the plugin makes a handful of writes; the bound
	// stops a child that never finishes from looping forever.
	const maxWrites = 20
	finished := false
	for n := 1; !finished && n <= maxWrites; n++ {
		t.Run("write-"+strconv.Itoa(n), func(t *testing.T) {
			e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
			e.AddClaim(t, c)
			initial := e.Snapshot(t).String()
			step := runHelper(t, e, "TestWriteCrashChildProcess", modePluginPrepare, n)
			if step == "" {
				finished = true
				return
			}
			steps = append(steps, step)
			// Else this crash point would test nothing.
			if left := tempFiles(t, e); len(left) == 0 {
				t.Fatalf("killed inside %q, but no temporary file was left", step)
			}
			_, kubelet := preparetest.StartPlugin(t, e, e.NewState(t, nil))
			resp, err := kubelet.DRA.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
			if err != nil {
				t.Fatal(err)
			}
			if r := resp.Claims[string(c.UID)]; r == nil || r.Error != "" {
				t.Fatalf("unprepare after a kill inside %q: %+v", step, r)
			}
			if left := claimFiles(t, e, c); len(left) > 0 {
				t.Errorf("killed inside %q, then unprepared: files of the claim are left: %v", step, left)
			}
			if got := e.Snapshot(t).String(); got != initial {
				t.Errorf("killed inside %q, then unprepared: host is\n%s\nwant\n%s", step, got, initial)
			}
		})
	}
	if !finished {
		t.Fatalf("the child never finished a prepare through the plugin within %d writes", maxWrites)
	}
	// vfnet's spec, then per request (two) the metadata file and its spec.
	if len(steps) != 5 || steps[0] != prepare.StepCDITempWritten {
		t.Fatalf("killed inside %q; want vfnet's CDI spec write and 4 metadata writes", steps)
	}
	t.Logf("killed inside each of %d writes: %q", len(steps), steps)
}

// TestHelperTempNamesAreRemoved pins unprepare's cleanup to the names the
// kubeletplugin helper's real write gives its temporary files: it records
// (inotify) every temporary file renamed into a final file while claims
// are prepared through the plugin, plants those names again as a kill
// would have left them, and checks that unpreparing one claim removes
// exactly its own.
func TestHelperTempNamesAreRemoved(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
	a := crashClaim()
	b := preparetest.Claim("ns", "other", "uid-other", []string{"vf-0000-3b-02-2"})
	requests := map[*resourceapi.ResourceClaim][]string{a: {"vf", "vfx"}, b: {"vf"}}
	watch := newWatcher(t, e.CDIRoot)
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		e.AddClaim(t, c)
		for _, r := range requests[c] {
			// The helper creates it; it must exist to be watched.
			dir := filepath.Join(e.PluginDir, prepare.MetadataDirName, c.Namespace+"_"+c.Name, r)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			watch.add(t, dir)
		}
	}
	_, kubelet := preparetest.StartPlugin(t, e, e.NewState(t, nil))
	temps := map[*resourceapi.ResourceClaim][]string{}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		resp, err := kubelet.DRA.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
		if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
			t.Fatalf("prepare %s: %v %+v", c.Name, err, resp)
		}
		renames := watch.renames(t)
		// Every file a prepare writes came from a temporary file.
		want := []string{filepath.Join(e.CDIRoot, "sriov.vfnet.io-vf_"+string(c.UID)+".json")}
		for _, r := range requests[c] {
			want = append(want, filepath.Join(e.CDIRoot, "sriov.vfnet.io_metadata_"+string(c.UID)+"_"+r+".json"),
				filepath.Join(e.PluginDir, prepare.MetadataDirName, c.Namespace+"_"+c.Name, r, "metadata.json"))
		}
		for _, f := range want {
			tmp, ok := renames[f]
			if !ok {
				t.Fatalf("prepare of %s wrote no %s through a rename; renames seen: %v", c.Name, f, renames)
			}
			if _, err := os.Stat(f); err != nil {
				t.Fatal(err)
			}
			temps[c] = append(temps[c], tmp)
		}
	}
	for _, p := range slices.Concat(temps[a], temps[b]) {
		if err := os.WriteFile(p, []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		resp, err := kubelet.DRA.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
		if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
			t.Fatalf("unprepare %s: %v %+v", c.Name, err, resp)
		}
		for _, p := range temps[c] {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left by the helper's write for %s is still there after its unprepare (%v)", p, c.Name, err)
			}
		}
		if c == a {
			for _, p := range temps[b] {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("unprepare of %s removed %s of %s: %v", a.Name, p, b.Name, err)
				}
			}
		}
	}
}

// tempFiles lists the dot files in the CDI and metadata directories.
func tempFiles(t *testing.T, e *preparetest.Env) []string {
	t.Helper()
	var out []string
	for _, f := range allFiles(t, e) {
		if strings.HasPrefix(filepath.Base(f), ".") {
			out = append(out, f)
		}
	}
	return out
}

// claimFiles lists the files in the CDI and metadata directories that
// belong to c: named after its UID, or under its metadata directory.
func claimFiles(t *testing.T, e *preparetest.Env, c *resourceapi.ResourceClaim) []string {
	t.Helper()
	metaDir := filepath.Join(e.PluginDir, prepare.MetadataDirName, c.Namespace+"_"+c.Name)
	var out []string
	for _, f := range allFiles(t, e) {
		if strings.Contains(filepath.Base(f), string(c.UID)) || strings.HasPrefix(f, metaDir+string(filepath.Separator)) || f == metaDir {
			out = append(out, f)
		}
	}
	return out
}

// allFiles lists everything under the CDI directory and the helper's
// metadata directory (directories included).
func allFiles(t *testing.T, e *preparetest.Env) []string {
	t.Helper()
	var out []string
	for _, root := range []string{e.CDIRoot, filepath.Join(e.PluginDir, prepare.MetadataDirName)} {
		err := filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
			if os.IsNotExist(err) {
				return nil
			}
			if err == nil && p != root {
				out = append(out, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// watcher records renames in a set of directories with inotify.
type watcher struct {
	fd   int
	dirs map[int32]string
}

func newWatcher(t *testing.T, dirs ...string) *watcher {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	w := &watcher{fd: fd, dirs: map[int32]string{}}
	for _, d := range dirs {
		w.add(t, d)
	}
	return w
}

func (w *watcher) add(t *testing.T, dir string) {
	t.Helper()
	wd, err := unix.InotifyAddWatch(w.fd, dir, unix.IN_MOVED_FROM|unix.IN_MOVED_TO)
	if err != nil {
		t.Fatalf("inotify watch %s: %v", dir, err)
	}
	w.dirs[int32(wd)] = dir
}

// renames drains the queued events and maps each rename's target to its
// source (paths). The kernel queues the events as the renames happen, so
// everything done before the call is there.
func (w *watcher) renames(t *testing.T) map[string]string {
	t.Helper()
	from := map[uint32]string{}
	out := map[string]string{}
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(w.fd, buf)
		if err == unix.EAGAIN {
			return out
		}
		if err != nil {
			t.Fatalf("read inotify events: %v", err)
		}
		if n < unix.SizeofInotifyEvent {
			t.Fatalf("short inotify read: %d bytes", n)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, then the name.
			hdr := buf[off : off+unix.SizeofInotifyEvent]
			wd := int32(binary.NativeEndian.Uint32(hdr[0:]))
			mask := binary.NativeEndian.Uint32(hdr[4:])
			cookie := binary.NativeEndian.Uint32(hdr[8:])
			nameLen := int(binary.NativeEndian.Uint32(hdr[12:]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen]), "\x00")
			off += unix.SizeofInotifyEvent + nameLen
			if mask&unix.IN_Q_OVERFLOW != 0 {
				t.Fatal("inotify queue overflowed")
			}
			p := filepath.Join(w.dirs[wd], name)
			switch {
			case mask&unix.IN_MOVED_FROM != 0:
				from[cookie] = p
			case mask&unix.IN_MOVED_TO != 0:
				src, ok := from[cookie]
				if !ok {
					t.Fatalf("inotify: rename to %s without its source", p)
				}
				out[p] = src
			}
		}
	}
}
