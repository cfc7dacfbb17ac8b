// Package controlplane starts a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1 for
// the end-to-end tests and the demo, and tears it down on every exit path.
//
// The API server runs with RBAC authorization, a static admin token in
// system:masters and a service-account signing key, so ServiceAccount tokens
// made with the TokenRequest API authenticate like in a cluster, including the
// node-name extra of tokens bound to a pod scheduled to a node.
//
// Child processes are started with a parent-death signal, so even a killed
// test binary does not leave them running; Stop kills them by PID and waits,
// and removes the plane's temporary directory. Directories of earlier planes
// whose owning process is gone are removed by the next Start.
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/ownerdir"
)

// Options configure Start. The zero value is usable.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler and kubectl. Empty: see BinDir.
	BinDir string
	// StartTimeout bounds the wait for every component to become ready.
	// Default DefaultStartTimeout.
	StartTimeout time.Duration
	// ExtraAPIServerFlags are appended to kube-apiserver's command line.
	ExtraAPIServerFlags []string
	// ExtraSchedulerFlags and ExtraControllerManagerFlags are appended to
	// kube-scheduler's and kube-controller-manager's command lines (the
	// scale benchmark raises their client QPS as a large cluster would).
	ExtraSchedulerFlags         []string
	ExtraControllerManagerFlags []string
	// ExtraControllers are started by kube-controller-manager besides the
	// ones the flow needs (a real node needs daemonset-controller and
	// root-ca-certificate-publisher-controller).
	ExtraControllers []string
	// KubeVirt serves what KubeVirt's control plane (virt-operator,
	// virt-api, virt-controller) needs beyond the flow's: see
	// KubeVirtControllers and KubeVirtAPIServerFlags.
	KubeVirt bool
	// HandleSignals makes the plane stop itself on SIGINT/SIGTERM and then
	// re-raise the signal, so an interrupted run leaves nothing behind.
	HandleSignals bool

	// pickPorts chooses the components' ports (nil: freePorts); a test
	// replaces it to hand out a taken port.
	pickPorts func(n int) ([]int, error)
}

// KubeVirtControllers are the kube-controller-manager controllers KubeVirt
// needs: virt-operator, virt-api and virt-controller are Deployments
// (deployment-, replicaset-controller); virt-operator writes its install
// strategy with a Job running its own image (job-controller); the API
// server finds virt-api's pod for its webhooks and the subresources
// APIService through EndpointSlices (endpointslice-controller).
func KubeVirtControllers() []string {
	return []string{"deployment-controller", "replicaset-controller", "job-controller", "endpointslice-controller"}
}

// KubeVirtAPIServerFlags are the kube-apiserver flags KubeVirt needs: with
// no kube-proxy, webhooks and aggregated APIs must be reached at their
// endpoints' pod IPs, not at the Service's ClusterIP. (The request-header
// authentication virt-api also needs is always on: see frontproxy.go.)
func KubeVirtAPIServerFlags() []string {
	return []string{"--enable-aggregator-routing=true"}
}

// Plane is a running control plane.
type Plane struct {
	// Dir is the plane's temporary directory (logs, certs, etcd data).
	Dir string
	// BinDir is where the binaries came from (kubectl lives there too).
	BinDir string
	// URL is the API server's https URL.
	URL string
	// AdminToken authenticates as a member of system:masters.
	AdminToken string
	// AdminKubeconfig is a kubeconfig file for the admin token.
	AdminKubeconfig string
	// StartDuration is how long Start took until every component was ready.
	StartDuration time.Duration

	caData []byte
	procs  []*proc

	stopOnce sync.Once
	stopErr  error
	sigStop  func()
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

const dirPrefix = "vfnet-cp-"

// DefaultStartTimeout only bounds a hang: a component that fails exits, and
// Start reports that at once. A ready plane returns as soon as it is ready,
// so a long bound costs nothing; 90 s was too short in a fresh clone's
// make test beside another (load 21-25 on two cores), where two API servers
// were still not answering /readyz after it.
const DefaultStartTimeout = 5 * time.Minute

// pollTimeout bounds one readiness request. Under that load an API server's
// /readyz took over 2 s (its "Post-timeout activity" log), so a 2 s client
// timeout could fail every poll of a server that was ready.
const pollTimeout = 15 * time.Second

// Start launches etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler and waits until all report ready. On any failure everything
// already started is stopped before the error returns; the error carries the
// tail of the failing component's log.
//
// A port is free when it is picked and taken by its component seconds
// later; another plane of a parallel test may take it meanwhile. A
// component that exits because its port is in use makes Start try again
// with new ports, up to portAttempts times.
func Start(ctx context.Context, opts Options) (*Plane, error) {
	logger := klog.FromContext(ctx)
	if opts.StartTimeout == 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.BinDir == "" {
		dir, err := BinDir(ctx)
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	} else if err := checkBinaries(opts.BinDir); err != nil {
		return nil, err
	}
	if opts.pickPorts == nil {
		opts.pickPorts = freePorts
	}
	for attempt := 1; ; attempt++ {
		p, err := start(ctx, opts)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return p, err
		}
		logger.Info("A control-plane port was taken before its component bound it, starting again with new ports", "attempt", attempt, "err", err)
	}
}

// portAttempts bounds Start's tries when a port is taken under it.
const portAttempts = 3

// errPortInUse marks a component that exited because its port was taken.
var errPortInUse = errors.New("port already in use")

func start(ctx context.Context, opts Options) (_ *Plane, retErr error) {
	logger := klog.FromContext(ctx)
	begin := time.Now()
	dir, err := ownerdir.Make(logger, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create control-plane temp dir: %w", err)
	}
	p := &Plane{Dir: dir, BinDir: opts.BinDir}
	defer func() {
		if retErr != nil {
			if err := p.Stop(); err != nil {
				logger.Error(err, "Stopping partially started control plane")
			}
		}
	}()
	if opts.HandleSignals {
		p.handleSignals(logger)
	}

	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	ports, err := opts.pickPorts(5)
	if err != nil {
		return nil, err
	}
	etcdPort, etcdPeer, apiPort, schedPort, cmPort := ports[0], ports[1], ports[2], ports[3], ports[4]

	// etcd
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	if err := p.spawn("etcd", filepath.Join(opts.BinDir, "etcd"),
		"--name=vfnet", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-cluster=vfnet=http://127.0.0.1:%d", etcdPeer),
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "etcd", etcdURL+"/health", nil); err != nil {
		return nil, err
	}

	// kube-apiserver
	tokenBytes := make([]byte, 16)
	if _, err := rand.Read(tokenBytes); err != nil {
		return nil, fmt.Errorf("generate admin token: %w", err)
	}
	p.AdminToken = hex.EncodeToString(tokenBytes)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(p.AdminToken+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write token auth file: %w", err)
	}
	saKey, saPub, err := writeServiceAccountKeys(dir)
	if err != nil {
		return nil, err
	}
	frontProxy, err := writeFrontProxyCerts(dir)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	p.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", apiPort),
		// Without it the server refuses a loopback advertise address.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		// Nothing would remove the not-ready taint from Node objects.
		"--disable-admission-plugins=TaintNodesByCondition",
		"--profiling=false",
	}
	// Aggregated API servers (KubeVirt's virt-api) authenticate the API
	// server's proxied requests with these, as in a kubeadm cluster.
	apiArgs = append(apiArgs, frontProxy.apiServerFlags()...)
	if opts.KubeVirt {
		apiArgs = append(apiArgs, KubeVirtAPIServerFlags()...)
	}
	apiArgs = append(apiArgs, opts.ExtraAPIServerFlags...)
	if err := p.spawn("kube-apiserver", filepath.Join(opts.BinDir, "kube-apiserver"), apiArgs...); err != nil {
		return nil, err
	}
	// The serving cert is self-signed and written at startup: wait for it,
	// then trust exactly it.
	certFile := filepath.Join(certDir, "apiserver.crt")
	if p.caData, err = p.waitServingCert(ctx, "kube-apiserver", certFile); err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "kube-apiserver", p.URL+"/readyz", p.AdminRESTConfig()); err != nil {
		return nil, err
	}
	p.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := p.WriteKubeconfig(p.AdminKubeconfig, p.AdminToken); err != nil {
		return nil, err
	}

	// kube-controller-manager: only the controllers the flow needs (the
	// resourceclaim controller makes claims from templates, the service
	// account controller makes "default" SAs pods need, the policy status
	// controller type-checks ValidatingAdmissionPolicies).
	controllers := append([]string{"serviceaccount-controller", "resourceclaim-controller",
		"garbage-collector-controller", "namespace-controller", "validatingadmissionpolicy-status-controller"},
		opts.ExtraControllers...)
	if opts.KubeVirt {
		controllers = append(controllers, KubeVirtControllers()...)
	}
	cmArgs := []string{
		"--kubeconfig=" + p.AdminKubeconfig,
		"--authentication-kubeconfig=" + p.AdminKubeconfig,
		"--authorization-kubeconfig=" + p.AdminKubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", cmPort),
		"--leader-elect=false",
		"--controllers=" + strings.Join(controllers, ","),
		// What the root-ca publisher puts into every namespace's
		// kube-root-ca.crt, which pods trust the API server with.
		"--root-ca-file=" + certFile,
	}
	if err := p.spawn("kube-controller-manager", filepath.Join(opts.BinDir, "kube-controller-manager"),
		append(cmArgs, opts.ExtraControllerManagerFlags...)...); err != nil {
		return nil, err
	}
	schedArgs := []string{
		"--kubeconfig=" + p.AdminKubeconfig,
		"--authentication-kubeconfig=" + p.AdminKubeconfig,
		"--authorization-kubeconfig=" + p.AdminKubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", schedPort),
		"--leader-elect=false",
	}
	if err := p.spawn("kube-scheduler", filepath.Join(opts.BinDir, "kube-scheduler"),
		append(schedArgs, opts.ExtraSchedulerFlags...)...); err != nil {
		return nil, err
	}
	insecure := &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	if err := p.waitHTTP(ctx, "kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/readyz", schedPort), insecure); err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "kube-controller-manager", fmt.Sprintf("https://127.0.0.1:%d/healthz", cmPort), insecure); err != nil {
		return nil, err
	}
	// A component whose port was taken by another plane's exits at once,
	// while the other's answer may have passed its readiness check: by now
	// its exit shows.
	for _, pr := range p.procs {
		if err := p.exited(pr.name); err != nil {
			return nil, err
		}
	}
	p.StartDuration = time.Since(begin)
	logger.Info("Control plane ready", "url", p.URL, "dir", dir, "startDuration", p.StartDuration)
	return p, nil
}

// PID returns the process ID of a running component ("etcd",
// "kube-apiserver", "kube-controller-manager", "kube-scheduler"), for
// resource measurements; an error if it is unknown or has exited.
func (p *Plane) PID(component string) (int, error) {
	for _, pr := range p.procs {
		if pr.name != component {
			continue
		}
		select {
		case <-pr.done:
			return 0, fmt.Errorf("control-plane component %s has exited: %v", component, pr.err)
		default:
			return pr.cmd.Process.Pid, nil
		}
	}
	return 0, fmt.Errorf("no control-plane component %q (have etcd, kube-apiserver, kube-controller-manager, kube-scheduler)", component)
}

// Pause stops a component with SIGSTOP until the returned resume is
// called (SIGCONT), so a benchmark can queue work for it without it
// starting early. Stop also ends a paused component (SIGKILL after the
// grace period), but call resume first.
func (p *Plane) Pause(component string) (resume func() error, err error) {
	pid, err := p.PID(component)
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("pause %s (pid %d): %w", component, pid, err)
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			if e := syscall.Kill(pid, syscall.SIGCONT); e != nil {
				err = fmt.Errorf("resume %s (pid %d): %w", component, pid, e)
			}
		})
		return err
	}, nil
}

// AdminRESTConfig returns a client config authenticated as cluster admin.
func (p *Plane) AdminRESTConfig() *rest.Config {
	return p.RESTConfigForToken(p.AdminToken)
}

// RESTConfigForToken returns a client config that authenticates with token
// (for example a ServiceAccount token from the TokenRequest API).
func (p *Plane) RESTConfigForToken(token string) *rest.Config {
	return &rest.Config{
		Host:            p.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caData},
		QPS:             100,
		Burst:           200,
	}
}

// AdminClient returns a clientset for the admin token.
func (p *Plane) AdminClient() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(p.AdminRESTConfig())
}

// WriteKubeconfig writes a kubeconfig file at path that reaches this plane
// with token, for programs such as kubectl and vfnet-driver.
func (p *Plane) WriteKubeconfig(path, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["vfnet"] = &clientcmdapi.Cluster{Server: p.URL, CertificateAuthorityData: p.caData}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["vfnet"] = &clientcmdapi.Context{Cluster: "vfnet", AuthInfo: "user"}
	cfg.CurrentContext = "vfnet"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// Kubectl runs the plane's kubectl as admin and returns its combined output.
func (p *Plane) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.BinDir, "kubectl"), append([]string{"--kubeconfig=" + p.AdminKubeconfig}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Stop kills every component by PID (SIGTERM, then SIGKILL after 10 s),
// waits for them and removes the plane's directory. It is safe to call more
// than once and from several goroutines.
func (p *Plane) Stop() error {
	p.stopOnce.Do(func() {
		if p.sigStop != nil {
			p.sigStop()
		}
		var errs []error
		// Reverse order: clients before the API server, etcd last.
		for i := len(p.procs) - 1; i >= 0; i-- {
			if err := p.procs[i].stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if p.Dir != "" {
			if err := os.RemoveAll(p.Dir); err != nil {
				errs = append(errs, fmt.Errorf("remove control-plane dir %s: %w", p.Dir, err))
			}
		}
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

func (p *Plane) spawn(name, bin string, args ...string) error {
	logPath := filepath.Join(p.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("create %s log: %w", name, err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = p.Dir
	// Own process group (a terminal's ^C reaches only us, and we stop the
	// children in order); die with the parent if it is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	pr := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		pr.err = cmd.Wait()
		close(pr.done)
	}()
	p.procs = append(p.procs, pr)
	return nil
}

func (pr *proc) stop() error {
	select {
	case <-pr.done:
		return nil
	default:
	}
	_ = pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	if err := pr.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", pr.name, pr.cmd.Process.Pid, err)
	}
	<-pr.done
	return nil
}

func (p *Plane) exited(name string) error {
	for _, pr := range p.procs {
		if pr.name != name {
			continue
		}
		select {
		case <-pr.done:
			last := tail(pr.log, 3000)
			if strings.Contains(last, "address already in use") {
				return fmt.Errorf("%s exited: %v: %w\n--- last lines of %s ---\n%s", name, pr.err, errPortInUse, pr.log, last)
			}
			return fmt.Errorf("%s exited: %v\n--- last lines of %s ---\n%s", name, pr.err, pr.log, last)
		default:
		}
	}
	return nil
}

// waitServingCert waits until path holds the server's whole self-signed
// chain and returns it. The API server writes the file with os.WriteFile
// (create, truncate, then write), so the file exists, empty, before its
// content does; trusting what a read returns at that moment leaves the
// client with no CA and every later TLS handshake fails with "certificate
// signed by unknown authority". The chain is complete once it parses and
// holds the CA that signed the leaf.
func (p *Plane) waitServingCert(ctx context.Context, name, path string) ([]byte, error) {
	last := "not written yet"
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			if err = completeChain(data); err == nil {
				return data, nil
			}
			last = err.Error()
		}
		if err := p.exited(name); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %s to write its serving cert %s: %w (last: %s)\n%s", name, path, ctx.Err(), last, tail(filepath.Join(p.Dir, name+".log"), 3000))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// completeChain reports why data is not yet a PEM chain whose first
// certificate verifies against a CA certificate in it.
func completeChain(data []byte) error {
	certs, err := certutil.ParseCertsPEM(data)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	for _, c := range certs {
		if c.IsCA {
			roots.AddCert(c)
		}
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		return fmt.Errorf("serving cert does not verify against the CA in the file yet: %w", err)
	}
	return nil
}

// waitHTTP polls url until it answers 200. cfg (may be nil for plain http)
// supplies TLS settings and a bearer token.
func (p *Plane) waitHTTP(ctx context.Context, name, url string, cfg *rest.Config) error {
	client := &http.Client{Timeout: pollTimeout}
	if cfg != nil {
		tlsCfg, err := rest.TLSConfigFor(cfg)
		if err != nil {
			return fmt.Errorf("TLS config for %s: %w", name, err)
		}
		if tlsCfg == nil {
			tlsCfg = &tls.Config{}
		}
		client.Transport = &http.Transport{TLSClientConfig: tlsCfg}
	}
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if cfg != nil && cfg.BearerToken != "" {
			req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if err := p.exited(name); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s ready at %s: %w (last answer: %s)\n--- last lines of its log ---\n%s",
				name, url, ctx.Err(), last, tail(filepath.Join(p.Dir, name+".log"), 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *Plane) handleSignals(logger klog.Logger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	quit := make(chan struct{})
	var once sync.Once
	p.sigStop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(quit)
		})
	}
	go func() {
		select {
		case sig := <-ch:
			logger.Info("Signal received, stopping control plane", "signal", sig)
			_ = p.Stop()
			// Let the default action (or another plane's handler) run.
			if s, ok := sig.(syscall.Signal); ok {
				_ = syscall.Kill(os.Getpid(), s)
			}
		case <-quit:
		}
	}()
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writeServiceAccountKeys(dir string) (keyFile, pubFile string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generate service-account key: %w", err)
	}
	keyFile, pubFile = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encode service-account public key: %w", err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", keyFile, err)
	}
	if err := os.WriteFile(pubFile, pubPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", pubFile, err)
	}
	return keyFile, pubFile, nil
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if len(data) > n {
		data = data[len(data)-n:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}
