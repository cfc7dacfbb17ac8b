// Package bench measures vfnet-binding next to KubeVirt v1.9.0's own passt
// binding sidecar on the same machine in the same run: OnDefineDomain
// latency over a persistent gRPC connection, and each sidecar's resident
// memory after the calls.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/hookclient"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmltree"
)

// PasstPackage is KubeVirt's passt binding sidecar, built from v1.9.0 in
// this module.
const PasstPackage = "kubevirt.io/kubevirt/cmd/sidecars/network-passt-binding"

// Config controls a run.
type Config struct {
	Calls  int       // measured calls per sidecar
	Warmup int       // unmeasured calls first
	Log    io.Writer // sidecars' own logs
	// AsTiers builds each sidecar as the other tests build its module:
	// vfnet-binding as shipped, the passt sidecar static and -trimpath as
	// `make test-kubevirt`, so on a cold Go cache the smoke test compiles
	// neither tree again. Off (bindingbench), both build alike with only
	// what the environment sets, the comparison's condition.
	AsTiers bool
}

// Result is one sidecar's numbers.
type Result struct {
	Name            string
	P50, P99, Mean  time.Duration
	Max             time.Duration
	RSSStartKiB     int // after start and warm-up
	RSSEndKiB       int // after all calls
	OutputBytes     int
	DomainBytesSent int
}

// Run builds both sidecars into workDir, starts them, and measures.
// Needs root: KubeVirt's passt sidecar only serves in
// /var/run/kubevirt-hooks, which is bind-mounted in a private mount
// namespace (the process must call mountns.Child early in main).
func Run(ctx context.Context, cfg Config, workDir string) ([]Result, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	vfnetBin := filepath.Join(workDir, "vfnet-binding")
	passtBin := filepath.Join(workDir, "passt-binding")
	buildBinding, passtEnv, passtFlags := product.BuildAsEnv, []string(nil), []string(nil)
	if cfg.AsTiers {
		buildBinding, passtEnv, passtFlags = product.Build, []string{"CGO_ENABLED=0"}, []string{"-trimpath"}
	}
	if err := buildBinding(ctx, product.BindingPackage, vfnetBin); err != nil {
		return nil, err
	}
	if err := buildHere(ctx, PasstPackage, passtBin, passtEnv, passtFlags...); err != nil {
		return nil, err
	}

	c := golden.BenchCase()
	dom, err := golden.Domain(c)
	if err != nil {
		return nil, err
	}
	domainXML, err := golden.MarshalDomainSpec(&dom.Spec)
	if err != nil {
		return nil, err
	}
	vmiJSON, err := golden.MarshalVMI(c.VMI)
	if err != nil {
		return nil, err
	}
	metaRoot := filepath.Join(workDir, "metadata")
	claims, err := c.Claims()
	if err != nil {
		return nil, err
	}
	for _, cl := range claims {
		if _, err := cl.Write(metaRoot); err != nil {
			return nil, err
		}
	}

	// Short socket dirs: unix socket paths must stay under 108 bytes.
	vfnetSock, err := os.MkdirTemp("", "vf")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(vfnetSock)
	passtSock, err := os.MkdirTemp("", "vf")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(passtSock)

	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	logFile, closeLog, err := logSink(cfg.Log, workDir)
	if err != nil {
		return nil, err
	}
	defer closeLog()

	vfnet, err := product.StartBinding(startCtx, vfnetBin, vfnetSock, metaRoot, golden.BindingName, logFile)
	if err != nil {
		return nil, err
	}
	defer vfnet.Stop()

	passtCmd, err := mountns.Command(mountns.Spec{
		Binds: []mountns.Bind{{Source: passtSock, Target: "/var/run/kubevirt-hooks"}},
		Exec:  []string{passtBin},
	})
	if err != nil {
		return nil, err
	}
	passtCmd.Stdout, passtCmd.Stderr = logFile, logFile
	passt, err := product.Start(startCtx, passtCmd, filepath.Join(passtSock, "passt.sock"))
	if err != nil {
		return nil, fmt.Errorf("KubeVirt passt sidecar: %w", err)
	}
	defer passt.Stop()

	sidecars := []*target{
		{name: "vfnet-binding", sc: vfnet, check: checkVfnet(len(c.VFs))},
		{name: "kubevirt passt-binding v1.9.0", sc: passt, check: checkPasst},
	}
	for _, s := range sidecars {
		if s.client, err = hookclient.Dial(s.sc.Socket); err != nil {
			return nil, err
		}
		defer s.client.Close()
	}

	// Warm up, check each output once, then alternate calls so both see the
	// same machine load.
	for _, s := range sidecars {
		for i := 0; i < cfg.Warmup; i++ {
			out, err := s.client.OnDefineDomain(ctx, domainXML, vmiJSON)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			if i == 0 {
				if err := s.check(out); err != nil {
					return nil, fmt.Errorf("%s output: %w", s.name, err)
				}
				s.outBytes = len(out)
			}
		}
		if s.rssStart, err = product.RSSKiB(s.sc.Cmd.Process.Pid); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Calls; i++ {
		for _, s := range sidecars {
			t0 := time.Now()
			if _, err := s.client.OnDefineDomain(ctx, domainXML, vmiJSON); err != nil {
				return nil, fmt.Errorf("%s call %d: %w", s.name, i, err)
			}
			s.lat = append(s.lat, time.Since(t0))
		}
	}
	var results []Result
	for _, s := range sidecars {
		rss, err := product.RSSKiB(s.sc.Cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		results = append(results, s.result(rss, len(domainXML)))
	}
	return results, nil
}

type target struct {
	name     string
	sc       *product.Sidecar
	client   *hookclient.Client
	check    func([]byte) error
	lat      []time.Duration
	rssStart int
	outBytes int
}

func (s *target) result(rssEnd, sent int) Result {
	lat := slices.Clone(s.lat)
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	r := Result{Name: s.name, RSSStartKiB: s.rssStart, RSSEndKiB: rssEnd, OutputBytes: s.outBytes, DomainBytesSent: sent}
	if n := len(lat); n > 0 {
		r.P50 = lat[n/2]
		r.P99 = lat[min(n-1, n*99/100)]
		r.Max = lat[n-1]
		r.Mean = sum / time.Duration(n)
	}
	return r
}

// checkVfnet: the output must hold one ua-sriov- hostdev per VF.
func checkVfnet(want int) func([]byte) error {
	return func(out []byte) error {
		tree, err := xmltree.Parse(out)
		if err != nil {
			return err
		}
		got := len(tree.Find(func(n *xmltree.Node) bool {
			a := n.Child("alias")
			return n.Name.Local == "hostdev" && a != nil && strings.HasPrefix(a.Attr("name"), "ua-sriov-")
		}))
		if got != want {
			return fmt.Errorf("%d vfnet hostdevs, want %d", got, want)
		}
		return nil
	}
}

// checkPasst: the output must hold the passt-backed interface.
func checkPasst(out []byte) error {
	tree, err := xmltree.Parse(out)
	if err != nil {
		return err
	}
	got := tree.Find(func(n *xmltree.Node) bool {
		b := n.Child("backend")
		return n.Name.Local == "interface" && b != nil && b.Attr("type") == "passt"
	})
	if len(got) != 1 {
		return fmt.Errorf("%d passt interfaces, want 1", len(got))
	}
	return nil
}

func buildHere(ctx context.Context, pkg, out string, env []string, flags ...string) error {
	dir, err := product.ModuleDir()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", append(append([]string{"build"}, flags...), "-o", out, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// logSink gives the sidecars an *os.File for their output: exec needs one
// to avoid a copying goroutine per process.
func logSink(w io.Writer, dir string) (*os.File, func(), error) {
	if f, ok := w.(*os.File); ok {
		return f, func() {}, nil
	}
	f, err := os.Create(filepath.Join(dir, "sidecars.log"))
	if err != nil {
		return nil, nil, err
	}
	return f, func() { f.Close() }, nil
}

// Format renders results as a small table.
func Format(rs []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %10s %10s %10s %10s %12s %12s\n", "sidecar", "p50", "p99", "mean", "max", "RSS start", "RSS end")
	for _, r := range rs {
		fmt.Fprintf(&b, "%-32s %10s %10s %10s %10s %9d KiB %9d KiB\n", r.Name,
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Mean.Round(time.Microsecond),
			r.Max.Round(time.Microsecond), r.RSSStartKiB, r.RSSEndKiB)
	}
	return b.String()
}
