// Package app is vfnet-driver's command line: the long-running DRA driver
// and the `inspect` subcommand. cmd/vfnet-driver/main.go only calls Main,
// without a simulator; test/cmd/vfnet-driver-sim passes one (package simulate),
// so test/lib/simhost is linked only into that binary, never into the shipped one.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/driver"
	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/driver/standby"
	"github.com/vfnet-io/vfnet/driver/vfcount"
)

// Simulator opens a simulated host in place of the kernel (--simulate): the
// one built under sysfsRoot, with its /dev at devRoot (empty: its own) and
// its VF link layer on the namespace file hostNetns. It is a parameter, not
// a registration, so that whether a binary can simulate is decided by its
// main package alone: only test/cmd/vfnet-driver-sim passes one.
type Simulator func(sysfsRoot, devRoot, hostNetns string) (*driver.Host, error)

// SimBinary names the build that carries the simulator, for errors.
const SimBinary = "vfnet-driver-sim (test/cmd/vfnet-driver-sim)"

// Main runs vfnet-driver with args (without the program name) and returns
// the process exit code. sim serves --simulate; nil (the shipped build)
// refuses the flag.
func Main(args []string, stdout, stderr io.Writer, sim Simulator) int {
	if len(args) > 0 && args[0] == "inspect" {
		return Inspect(args[1:], stdout, stderr, sim)
	}
	return runDriver(args, stderr, sim)
}

// simulateFlag defines --simulate; its help says whether this build can.
func simulateFlag(fs *flag.FlagSet, p *bool, sim Simulator, help string) {
	if sim == nil {
		help = "not in this build, which links no simulator: " + SimBinary + " has it (tests and demos)"
	}
	fs.BoolVar(p, "simulate", false, help)
}

// simulating is the simulator to run on: sim when --simulate was given,
// nil (the kernel) when not, so that from here on sim != nil means
// simulating. --simulate on a build without one is exit code 2.
func simulating(simulate bool, sim Simulator, cmd string, stderr io.Writer) (Simulator, int) {
	if !simulate {
		return nil, 0
	}
	if sim == nil {
		fmt.Fprintf(stderr, "%s: --simulate: this vfnet-driver is the shipped build and links no simulator; "+
			"run %s for a simulated host, or drop --simulate to act on this host's kernel\n", cmd, SimBinary)
		return nil, 2
	}
	return sim, 0
}

// alias registers another name for an existing flag (the manifests and
// test harnesses use --node-config and --cdi-dir).
func alias(fs *flag.FlagSet, name, of string) {
	f := fs.Lookup(of)
	fs.Var(f.Value, name, "alias of --"+of)
}

// Inspect prints, without a cluster, the ResourceSlices the driver would
// publish, as YAML documents. sim serves --simulate as in Main.
func Inspect(args []string, stdout, stderr io.Writer, sim Simulator) int {
	fs := flag.NewFlagSet("vfnet-driver inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("sysfs-root", "/sys", "root of the sysfs tree to read")
	cfgPath := fs.String("config", "", "node configuration file (NodeConfig YAML); without it nothing is offered")
	node := fs.String("node-name", os.Getenv("NODE_NAME"), "node name: the pool name (env NODE_NAME)")
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/plugins/"+discovery.DriverName, "plugin data directory; VFs its checkpoint holds count as vfnet's own")
	procRoot := fs.String("proc-root", "/proc", "host /proc: who holds /dev/vfio group nodes open")
	devRoot := fs.String("dev-root", "/dev", "root of /dev (vfio device nodes)")
	hostNetns := fs.String("host-netns", vflink.DefaultHostNetns, hostNetnsHelp)
	var simulate bool
	simulateFlag(fs, &simulate, sim, "read the simulated host built by test/lib/simhost under --sysfs-root (its own host network namespace unless --host-netns names another file than the default)")
	alias(fs, "node-config", "config")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	sim, code := simulating(simulate, sim, "vfnet-driver inspect", stderr)
	if code != 0 {
		return code
	}
	if *node == "" {
		fmt.Fprintln(stderr, "vfnet-driver inspect: --node-name (or NODE_NAME) is required: the pool is named after the node")
		return 2
	}
	cfg, err := driver.LoadNodeConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "vfnet-driver inspect: %v\n", err)
		return 1
	}
	h, err := openHost(*root, *devRoot, *hostNetns, sim)
	if err != nil {
		fmt.Fprintf(stderr, "vfnet-driver inspect: %v\n", err)
		return 1
	}
	defer h.Close()
	ctx := klog.NewContext(context.Background(), klog.NewKlogr().V(10)) // skips are printed below instead
	host := sysfs.New(*root)
	rep, err := host.DiscoverReport(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "vfnet-driver inspect: discover SR-IOV devices under %s: %v\n", *root, err)
		return 1
	}
	pfs := rep.PFs
	for _, s := range rep.Skipped {
		fmt.Fprintf(stderr, "# not offered: %s: %s\n", s.Path, s.Reason)
	}
	owned, err := checkpointVFs(filepath.Join(*pluginDir, checkpoint.FileName))
	if err != nil {
		fmt.Fprintf(stderr, "# %v: VFs vfnet prepared show as not offered\n", err)
	}
	res, err := discovery.Build(pfs, cfg, discovery.Options{Owned: func(a string) bool { _, ok := owned[a]; return ok },
		NoIOMMUMode: host.NoIOMMUMode(), Holders: driver.GroupHolders(*procRoot, *devRoot), Resolve: driver.LinkResolver(h.Links)})
	if err != nil {
		fmt.Fprintf(stderr, "vfnet-driver inspect: %v\n", err)
		return 1
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(stderr, "# not offered: %s: %s\n", s.Address, s.Reason)
	}
	for _, s := range res.Notes {
		fmt.Fprintf(stderr, "# offered: %s: %s\n", s.Address, s.Reason)
	}
	if res.Why != "" {
		fmt.Fprintf(stderr, "# %s\n", res.Why)
	}
	// What the driver would do about numVFs; without a cluster only the
	// checkpoint's claims can block a change.
	var vfs []sysfs.VF
	for i := range pfs {
		vfs = append(vfs, pfs[i].VFs...)
	}
	held, err := vfcount.HeldVFs(vfs, driver.GroupHolders(*procRoot, *devRoot))
	if err != nil {
		fmt.Fprintf(stderr, "# numVFs: cannot tell which VFs on vfio-pci are held open: %v\n", err)
	}
	plans := vfcount.Plans(cfg, pfs, host, vfcount.Usage{Prepared: owned, Held: held})
	for _, p := range plans {
		fmt.Fprintf(stderr, "# numVFs: %s\n", p)
		if p.State == vfcount.Pending {
			fmt.Fprintf(stderr, "# numVFs: PF %s: the driver also waits for claims allocated to its VFs, which inspect cannot see (no cluster access)\n", p.PF)
		}
	}
	out := publish.ResourceSlices(discovery.DriverName, *node, publish.DriverResourcesWith(*node, res.Devices, publish.PFTaints(pfs, res.Devices), vfcount.Taints(plans)))
	for i := range out {
		b, err := yaml.Marshal(&out[i])
		if err != nil {
			fmt.Fprintf(stderr, "vfnet-driver inspect: render slice %d: %v\n", i, err)
			return 1
		}
		if i > 0 {
			fmt.Fprintln(stdout, "---")
		}
		if _, err := stdout.Write(b); err != nil {
			return 1
		}
	}
	return 0
}

const hostNetnsHelp = "network namespace file of the host, whose netdevs the PFs are: every VF setting goes through netlink sockets opened there " +
	"(the default is the host init's, which a pod sees with hostPID: true)"

// checkpointVFs reads the running driver's checkpoint without changing
// anything, leniently (a diagnostic tool should still say what it can):
// the VFs vfnet prepared, bound to vfio-pci by vfnet, and their claims.
func checkpointVFs(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	var f checkpoint.File
	if err := json.Unmarshal(data, &f); err != nil || f.Version != checkpoint.Version {
		return nil, fmt.Errorf("checkpoint %s unreadable (version %d, want %d): %v", path, f.Version, checkpoint.Version, err)
	}
	return prepare.PreparedVFs(&f), nil
}

type driverFlags struct {
	sysfsRoot, devRoot, config, nodeName, kubeconfig string
	resync, healthInterval                           time.Duration
	registrarDir, pluginDir, cdiRoot, podUID         string
	kubeletPodsDir, procRoot, bindingName            string
	healthAddr, hostNetns                            string
	simulate                                         bool
	pendingInterval, claimsListTimeout               time.Duration
	// Failover standby plumbing (driver/standby).
	standbyNRI              bool
	nriSocket, standbyNetns string
}

func runDriver(args []string, stderr io.Writer, sim Simulator) int {
	var f driverFlags
	fs := flag.NewFlagSet("vfnet-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.sysfsRoot, "sysfs-root", "/sys", "root of the sysfs tree")
	fs.StringVar(&f.devRoot, "dev-root", "/dev", "root of /dev (vfio device nodes)")
	fs.StringVar(&f.config, "config", "", "node configuration file (NodeConfig YAML), re-read on every rescan; without it nothing is offered (alias --node-config)")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	fs.DurationVar(&f.resync, "resync-interval", 5*time.Minute, "how often to reread sysfs and the node configuration without being told to: kernel events (uevents, link notifications) and changes of the --config file trigger a rescan at once; this catches a missed event (alias --rescan-interval)")
	fs.DurationVar(&f.healthInterval, "health-interval", 5*time.Minute, "how often to re-check PF presence and link state without being told to (link notifications and uevents trigger it at once)")
	fs.DurationVar(&f.pendingInterval, "vf-count-retry-interval", 5*time.Second, "how often to re-check a VF count change (numVFs) that waits for claims, or for its taints to be published")
	fs.DurationVar(&f.claimsListTimeout, "claims-list-timeout", vfcount.DefaultListTimeout, "how long listing ResourceClaims for a VF count change (numVFs) may take before the change waits for the next try; the last list runs under the lock prepare takes, so keep it well under the kubelet's 45 s prepare timeout")
	fs.StringVar(&f.registrarDir, "registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registration directory")
	fs.StringVar(&f.pluginDir, "plugin-dir", "/var/lib/kubelet/plugins/"+discovery.DriverName, "plugin data directory (DRA socket, checkpoint, device metadata)")
	fs.StringVar(&f.cdiRoot, "cdi-root", "/var/run/cdi", "CDI spec directory (alias --cdi-dir)")
	fs.StringVar(&f.podUID, "pod-uid", os.Getenv("POD_UID"), "driver pod UID (env POD_UID); enables seamless rolling updates")
	fs.StringVar(&f.kubeletPodsDir, "kubelet-pods-dir", "/var/lib/kubelet/pods", "kubelet pods directory (launcher libvirt sockets, for live migration)")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "host /proc (who holds /dev/vfio group nodes open; QEMU memlock raise for live migration)")
	fs.StringVar(&f.bindingName, "binding-name", "vfnet", "name of the binding plugin in the KubeVirt CR")
	fs.StringVar(&f.healthAddr, "health-addr", "", "address for /healthz, /readyz and /metrics (Prometheus) (e.g. :51515); off when empty")
	fs.StringVar(&f.hostNetns, "host-netns", vflink.DefaultHostNetns, hostNetnsHelp)
	fs.BoolVar(&f.standbyNRI, "standby-nri", true, "plumb failover standbys (VFConfig.failover) as an NRI plugin of the container runtime: a tap for the VM's virtio standby in each launcher pod, "+
		"connected to the PF's node bridge (node config pfs[].standby.bridge); while NRI is not reachable failover claims are refused. false: vfnet makes no tap and failover claims are prepared without one")
	fs.StringVar(&f.nriSocket, "nri-socket", standby.DefaultSocket, "the container runtime's NRI socket (containerd: [plugins.'io.containerd.nri.v1.nri'] socket_path)")
	fs.StringVar(&f.standbyNetns, "standby-netns", "", "network namespace file of the node bridges failover standbys connect to; default: --host-netns "+
		"(with --simulate: none, so a simulated driver plumbs no standby unless given one)")
	simulateFlag(fs, &f.simulate, sim, "run on the simulated host built by test/lib/simhost under --sysfs-root instead of the real kernel (tests and demos only; its own host network namespace unless --host-netns names another file than the default)")
	alias(fs, "node-config", "config")
	alias(fs, "cdi-dir", "cdi-root")
	alias(fs, "rescan-interval", "resync-interval")
	logCfg := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(logCfg, fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vfnet-driver: unexpected arguments %q (the only subcommand is inspect)\n", fs.Args())
		return 2
	}
	sim, code := simulating(f.simulate, sim, "vfnet-driver", stderr)
	if code != 0 {
		return code
	}
	if err := logsapi.ValidateAndApply(logCfg, nil); err != nil {
		fmt.Fprintf(stderr, "vfnet-driver: logging flags: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if _, set := os.LookupEnv("GOGC"); !set {
		// The live heap is mostly two copies of the devices (the
		// resourceslice controller's desired slices and its informer
		// cache), which Go's default GOGC=100 lets grow to twice that
		// between cycles. Since the driver rescans only on host events an
		// idle driver allocates almost nothing, so the low target costs
		// little CPU at rest and keeps each burst's garbage from staying
		// resident (BENCHMARKS.md: driver-gogc, peers-idle). A soft memory
		// limit (GOMEMLIMIT) is not set by default: unlike a percentage it
		// does not scale with the host, and a node whose live heap
		// outgrows it would collect continuously (up to the runtime's 50%
		// CPU cap).
		debug.SetGCPercent(10)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := run(ctx, f, sim); err != nil {
		klog.FromContext(ctx).Error(err, "vfnet-driver failed")
		fmt.Fprintf(stderr, "vfnet-driver: %v\n", err)
		return 1
	}
	return 0
}

// openHost opens the real kernel's side (the VF link layer is netlink in
// the namespace hostNetns), or with sim (--simulate) the simulated host's.
func openHost(sysfsRoot, devRoot, hostNetns string, sim Simulator) (*driver.Host, error) {
	if sim == nil {
		l, err := vflink.Open(hostNetns)
		if err != nil {
			return nil, fmt.Errorf("--host-netns: %w", err)
		}
		return &driver.Host{Sysfs: sysfs.New(sysfsRoot), Writer: sysfs.RootWriter{Root: sysfsRoot}, Links: l, DevRoot: devRoot,
			Events: driver.HostEvents(hostNetns), Close: func() { l.Close() }}, nil
	}
	if devRoot == "/dev" {
		devRoot = "" // the simulated host's own
	}
	return sim(sysfsRoot, devRoot, hostNetns)
}

func kubeClients(kubeconfig string) (kubernetes.Interface, dynamic.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("Kubernetes client configuration (--kubeconfig %q): %w", kubeconfig, err)
	}
	cfg.UserAgent = "vfnet-driver"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return kube, dyn, nil
}

// run opens the host and the API server, runs the driver and, once it has
// published, the health endpoint beside it.
func run(ctx context.Context, f driverFlags, sim Simulator) error {
	cfg := driver.Config{
		NodeName: f.nodeName, ConfigPath: f.config,
		ResyncInterval: f.resync, HealthInterval: f.healthInterval, VFCountRetryInterval: f.pendingInterval,
		ClaimsListTimeout: f.claimsListTimeout,
		RegistrarDir:      f.registrarDir, PluginDir: f.pluginDir, CDIRoot: f.cdiRoot, PodUID: f.podUID,
		KubeletPodsDir: f.kubeletPodsDir, ProcRoot: f.procRoot, BindingName: f.bindingName, Simulated: sim != nil,
		Standby: driver.StandbyConfig{NRI: f.standbyNRI, NRISocket: f.nriSocket, HostNetns: standbyNetns(f, sim != nil)},
	}
	// Flags first: a mistake there is reported before the host is touched.
	if err := cfg.Validate(); err != nil {
		return err
	}
	h, err := openHost(f.sysfsRoot, f.devRoot, f.hostNetns, sim)
	if err != nil {
		return err
	}
	defer h.Close()
	if cfg.Kube, cfg.Dynamic, err = kubeClients(f.kubeconfig); err != nil {
		return err
	}
	cfg.Host = h
	d, err := driver.New(cfg)
	if err != nil {
		return err
	}
	if sim != nil {
		go warnSimulatedEvery(ctx, time.Minute, f.sysfsRoot)
	}
	klog.FromContext(ctx).Info("vfnet-driver starting", "node", f.nodeName, "sysfsRoot", f.sysfsRoot, "hostNetns", f.hostNetns, "config", f.config, "simulated", sim != nil)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-d.Started():
	}
	if f.healthAddr != "" {
		srv, err := serveHealth(ctx, f.healthAddr, d, 3*max(f.healthInterval, f.resync))
		if err != nil {
			cancel()
			<-done
			return err
		}
		defer srv.Close()
	}
	return <-done
}

// standbyNetns is where failover standbys connect: --standby-netns, else
// the host's namespace --host-netns names. A simulated driver has none by
// default: its --host-netns is the simulator's own namespace or, in the
// real-node tier, the machine's, whose network a test must not change.
func standbyNetns(f driverFlags, simulated bool) string {
	if f.standbyNetns != "" || simulated {
		return f.standbyNetns
	}
	return f.hostNetns
}

// warnSimulatedEvery says at start and every interval that the host is a
// simulation, so that nobody mistakes a simulated node's logs for a real one's.
func warnSimulatedEvery(ctx context.Context, interval time.Duration, root string) {
	warnSimulated(ctx, root)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			warnSimulated(ctx, root)
		}
	}
}

func warnSimulated(ctx context.Context, root string) {
	klog.FromContext(ctx).Info("!!! SIMULATED HOST: vfnet-driver --simulate is acting on the synthetic host under " + root +
		" (test/lib/simhost), NOT on real hardware; VFs, vfio-pci binds and VF settings are simulated !!!")
}

// scanner is what the health endpoint asks of the driver.
type scanner interface {
	LastScan() time.Time
	MetricsHandler() http.Handler
}

// serveHealth serves /healthz (the host was read within stale), /readyz
// (started only once the driver published) and /metrics.
func serveHealth(ctx context.Context, addr string, d scanner, stale time.Duration) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.MetricsHandler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if d := time.Since(d.LastScan()); d > stale {
			http.Error(w, fmt.Sprintf("no successful sysfs scan for %s", d.Truncate(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Health endpoint stopped")
		}
	}()
	return srv, nil
}
