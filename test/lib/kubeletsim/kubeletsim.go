// Package kubeletsim stands in for the kubelet of one node in the end-to-end
// tests and the demo: it creates the Node, registers DRA drivers over the
// real plugin-registration socket, and for every pod bound to its node calls
// the driver's NodePrepareResources / NodeUnprepareResources the way the
// kubelet's DRA manager does. For each prepared claim it resolves the CDI
// devices the driver returned and lays out what the pod's containers would
// see: the CDI mounts (KEP-5304 metadata files) appear below a per-container
// root, and the device nodes and env are recorded next to it.
//
// Pods never run: there is no container runtime. A pod marked for deletion
// is unprepared and then deleted with grace period 0, as the kubelet does
// once a pod's containers have stopped.
package kubeletsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Options configure a simulated kubelet.
type Options struct {
	NodeName string
	// NodeLabels are set on the Node it creates.
	NodeLabels map[string]string
	// Client acts as the kubelet (admin credentials are fine in tests).
	Client kubernetes.Interface
	// RegistrarDir is the plugins_registry directory watched for
	// registration sockets.
	RegistrarDir string
	// CDIDirs are searched for the CDI specs of prepared devices.
	CDIDirs []string
	// PodsDir receives one directory per pod UID with what each container
	// sees (see ContainerRoot).
	PodsDir string
	// PrepareTimeout bounds one gRPC call (default 30s, like the kubelet's
	// default plugin timeout... it is 45s there; shorter keeps tests snappy).
	PrepareTimeout time.Duration
}

// Kubelet is a running simulated kubelet.
type Kubelet struct {
	opts Options

	mu      sync.Mutex
	cond    *sync.Cond
	drivers map[string]*driverConn // by driver name
	sockets map[string]socketID    // registration socket path -> identity seen
	pods    map[types.UID]*PodState
	events  []string
}

type socketID struct {
	ino   uint64
	mtime int64
}

type driverConn struct {
	name     string
	endpoint string
	conn     *grpc.ClientConn
	client   drapb.DRAPluginClient
	// generation counts registrations, so a test sees a restart.
	generation int
}

// PodState is what the simulated kubelet did for one pod.
type PodState struct {
	UID       types.UID
	Namespace string
	Name      string
	// Claims are the prepared claims by pod claim name.
	Claims map[string]*PreparedClaim
	// Prepared is set once every claim of the pod is prepared.
	Prepared   bool
	PreparedAt time.Time
	// Err is the last prepare error (cleared on success).
	Err error
	// Unprepared is set once the pod's claims were unprepared.
	Unprepared bool
}

// PreparedClaim is one claim as NodePrepareResources returned it.
type PreparedClaim struct {
	PodClaimName string
	ClaimName    string
	ClaimUID     types.UID
	Driver       string
	Devices      []*drapb.Device
}

// ContainerEdits is what the CDI devices of a container add to it.
type ContainerEdits struct {
	CDIDevices  []string          `json:"cdiDevices"`
	DeviceNodes []string          `json:"deviceNodes"`
	Env         []string          `json:"env,omitempty"`
	Mounts      map[string]string `json:"mounts"` // container path -> host path
}

// New returns a kubelet for opts; Run starts it.
func New(opts Options) (*Kubelet, error) {
	if opts.NodeName == "" || opts.Client == nil || opts.RegistrarDir == "" || opts.PodsDir == "" {
		return nil, errors.New("kubeletsim: NodeName, Client, RegistrarDir and PodsDir are required")
	}
	if opts.PrepareTimeout == 0 {
		opts.PrepareTimeout = 30 * time.Second
	}
	k := &Kubelet{opts: opts, drivers: map[string]*driverConn{}, sockets: map[string]socketID{}, pods: map[types.UID]*PodState{}}
	k.cond = sync.NewCond(&k.mu)
	return k, nil
}

// CreateNode creates (or updates) the Node object with Ready status and
// room for pods, as a kubelet registering itself would.
func (k *Kubelet) CreateNode(ctx context.Context) error {
	nodes := k.opts.Client.CoreV1().Nodes()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.opts.NodeName, Labels: map[string]string{
		"kubernetes.io/hostname": k.opts.NodeName, "kubernetes.io/os": "linux",
	}}}
	for l, v := range k.opts.NodeLabels {
		node.Labels[l] = v
	}
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = nodes.Get(ctx, k.opts.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create node %s: %w", k.opts.NodeName, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	created.Status.Capacity, created.Status.Allocatable = res, res
	now := metav1.Now()
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "simulated kubelet (vfnet test/lib/kubeletsim)", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set node %s ready: %w", k.opts.NodeName, err)
	}
	return nil
}

// Run creates the Node and then, until ctx ends, registers plugins that
// appear in RegistrarDir and prepares/unprepares pods bound to the node.
func (k *Kubelet) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", k.opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if err := k.CreateNode(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(k.opts.PodsDir, 0o755); err != nil {
		return fmt.Errorf("create pods dir: %w", err)
	}
	defer k.closeConns()

	factory := informers.NewSharedInformerFactoryWithOptions(k.opts.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.opts.NodeName).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	// Events only mark a pod dirty; the sync loop below takes the newest
	// object, so no event is ever dropped and bursts coalesce.
	var pendingMu sync.Mutex
	dirty := map[types.UID]bool{}
	wake := make(chan struct{}, 1)
	latest := sync.Map{} // UID -> *corev1.Pod (a deleted pod carries a DeletionTimestamp)
	enqueue := func(obj any, deleted bool) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			if tomb, ok2 := obj.(cache.DeletedFinalStateUnknown); ok2 {
				pod, ok = tomb.Obj.(*corev1.Pod)
			}
			if !ok {
				return
			}
		}
		if deleted {
			pod = pod.DeepCopy()
			if pod.DeletionTimestamp == nil {
				pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}
		}
		latest.Store(pod.UID, pod)
		pendingMu.Lock()
		dirty[pod.UID] = true
		pendingMu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueue(obj, false) },
		UpdateFunc: func(_, obj any) { enqueue(obj, false) },
		DeleteFunc: func(obj any) { enqueue(obj, true) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	// Registration: poll the directory like the kubelet's plugin watcher.
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			k.scanRegistrations(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	// Pods are synced one at a time and retried while not done, as the
	// kubelet's pod workers retry a failing prepare.
	retry := time.NewTicker(500 * time.Millisecond)
	defer retry.Stop()
	pending := map[types.UID]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-retry.C:
		}
		pendingMu.Lock()
		for uid := range dirty {
			pending[uid] = true
		}
		clear(dirty)
		pendingMu.Unlock()
		for uid := range pending {
			v, ok := latest.Load(uid)
			if !ok {
				delete(pending, uid)
				continue
			}
			done, err := k.syncPod(ctx, v.(*corev1.Pod))
			if err != nil {
				logger.V(2).Info("Pod sync not done", "pod", klog.KObj(v.(*corev1.Pod)), "err", err)
			}
			if done {
				delete(pending, uid)
			}
		}
	}
}

// syncPod prepares a live pod's claims or tears a deleted pod down. It
// reports whether nothing is left to do for now.
func (k *Kubelet) syncPod(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if pod.DeletionTimestamp != nil {
		return k.teardown(ctx, pod)
	}
	k.mu.Lock()
	st := k.pods[pod.UID]
	if st == nil {
		st = &PodState{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Claims: map[string]*PreparedClaim{}}
		k.pods[pod.UID] = st
	}
	prepared := st.Prepared
	k.mu.Unlock()
	if prepared {
		return true, nil
	}
	err := k.prepare(ctx, pod, st)
	k.mu.Lock()
	st.Err = err
	if err == nil {
		st.Prepared, st.PreparedAt = true, time.Now()
		k.events = append(k.events, fmt.Sprintf("prepared %s/%s", pod.Namespace, pod.Name))
	}
	k.cond.Broadcast()
	k.mu.Unlock()
	return err == nil, err
}

func (k *Kubelet) prepare(ctx context.Context, pod *corev1.Pod, st *PodState) error {
	logger := klog.FromContext(ctx)
	byDriver := map[string][]*resourceapi.ResourceClaim{}
	podClaimOf := map[types.UID]string{}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, pc)
		if err != nil {
			return fmt.Errorf("pod claim %q: %w", pc.Name, err)
		}
		if name == nil {
			continue // template claim not needed (no devices requested)
		}
		claim, err := k.opts.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get claim %s/%s: %w", pod.Namespace, *name, err)
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
				return err
			}
		}
		if claim.Status.Allocation == nil {
			return fmt.Errorf("claim %s/%s is not allocated yet", pod.Namespace, claim.Name)
		}
		if !resourceclaim.IsReservedForPod(pod, claim, false) {
			return fmt.Errorf("claim %s/%s is not reserved for pod %s", pod.Namespace, claim.Name, pod.Name)
		}
		drivers := map[string]bool{}
		for _, r := range claim.Status.Allocation.Devices.Results {
			drivers[r.Driver] = true
		}
		for d := range drivers {
			byDriver[d] = append(byDriver[d], claim)
		}
		podClaimOf[claim.UID] = pc.Name
	}
	for driver, claims := range byDriver {
		dc, err := k.driver(driver)
		if err != nil {
			return err
		}
		req := &drapb.NodePrepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
		}
		cctx, cancel := context.WithTimeout(ctx, k.opts.PrepareTimeout)
		resp, err := dc.client.NodePrepareResources(cctx, req)
		cancel()
		if err != nil {
			k.dropDriver(driver, dc)
			return fmt.Errorf("NodePrepareResources on driver %s: %w", driver, err)
		}
		for _, c := range claims {
			r := resp.Claims[string(c.UID)]
			if r == nil {
				return fmt.Errorf("driver %s returned no result for claim %s/%s", driver, c.Namespace, c.Name)
			}
			if r.Error != "" {
				return fmt.Errorf("driver %s failed to prepare claim %s/%s: %s", driver, c.Namespace, c.Name, r.Error)
			}
			k.mu.Lock()
			st.Claims[podClaimOf[c.UID]] = &PreparedClaim{PodClaimName: podClaimOf[c.UID], ClaimName: c.Name, ClaimUID: c.UID, Driver: driver, Devices: r.Devices}
			k.mu.Unlock()
			logger.Info("Prepared claim", "pod", klog.KObj(pod), "claim", klog.KObj(c), "driver", driver, "devices", len(r.Devices))
		}
	}
	return k.layoutContainers(pod, st)
}

// layoutContainers writes, per container, the CDI edits of the devices of
// the claims (and requests) the container names in resources.claims, and
// links every CDI mount's host path at its container path below
// ContainerRoot, so tests read files where the container would.
func (k *Kubelet) layoutContainers(pod *corev1.Pod, st *PodState) error {
	k.mu.Lock()
	claims := make(map[string]*PreparedClaim, len(st.Claims))
	for n, c := range st.Claims {
		claims[n] = c
	}
	k.mu.Unlock()
	containers := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range containers {
		edits := ContainerEdits{Mounts: map[string]string{}}
		for _, ref := range c.Resources.Claims {
			pc := claims[ref.Name]
			if pc == nil {
				continue
			}
			for _, d := range pc.Devices {
				if ref.Request != "" && !matchesRequest(d.RequestNames, ref.Request) {
					continue
				}
				edits.CDIDevices = append(edits.CDIDevices, d.CdiDeviceIds...)
			}
		}
		if len(edits.CDIDevices) == 0 {
			continue
		}
		sort.Strings(edits.CDIDevices)
		root := k.ContainerRoot(pod.UID, c.Name)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
		for _, id := range edits.CDIDevices {
			dev, err := resolveCDI(k.opts.CDIDirs, id)
			if err != nil {
				return fmt.Errorf("container %s: %w", c.Name, err)
			}
			for _, m := range dev.Mounts {
				edits.Mounts[m.ContainerPath] = m.HostPath
				target := filepath.Join(root, m.ContainerPath)
				if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
					return err
				}
				_ = os.Remove(target)
				// A symlink behaves like the runtime's bind mount for a
				// reader: it sees the host file, including later updates.
				if err := os.Symlink(m.HostPath, target); err != nil {
					return fmt.Errorf("expose CDI mount %s at %s: %w", m.HostPath, target, err)
				}
			}
			edits.DeviceNodes = append(edits.DeviceNodes, dev.DeviceNodes...)
			edits.Env = append(edits.Env, dev.Env...)
		}
		data, _ := json.MarshalIndent(edits, "", "  ")
		if err := os.WriteFile(filepath.Join(k.opts.PodsDir, string(pod.UID), c.Name+".cdi-edits.json"), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func matchesRequest(names []string, req string) bool {
	for _, n := range names {
		if n == req || resourceclaim.BaseRequestRef(n) == req {
			return true
		}
	}
	return false
}

// teardown unprepares a pod's claims, removes its container views and
// finishes the deletion the way the kubelet does after the containers stop.
func (k *Kubelet) teardown(ctx context.Context, pod *corev1.Pod) (bool, error) {
	logger := klog.FromContext(ctx)
	k.mu.Lock()
	st := k.pods[pod.UID]
	k.mu.Unlock()
	if st != nil && !st.Unprepared {
		byDriver := map[string][]*PreparedClaim{}
		for _, c := range st.Claims {
			byDriver[c.Driver] = append(byDriver[c.Driver], c)
		}
		for driver, claims := range byDriver {
			dc, err := k.driver(driver)
			if err != nil {
				return false, err
			}
			req := &drapb.NodeUnprepareResourcesRequest{}
			for _, c := range claims {
				req.Claims = append(req.Claims, &drapb.Claim{Namespace: pod.Namespace, Name: c.ClaimName, Uid: string(c.ClaimUID)})
			}
			cctx, cancel := context.WithTimeout(ctx, k.opts.PrepareTimeout)
			resp, err := dc.client.NodeUnprepareResources(cctx, req)
			cancel()
			if err != nil {
				k.dropDriver(driver, dc)
				return false, fmt.Errorf("NodeUnprepareResources on driver %s: %w", driver, err)
			}
			for _, c := range claims {
				if r := resp.Claims[string(c.ClaimUID)]; r == nil || r.Error != "" {
					msg := "no result"
					if r != nil {
						msg = r.Error
					}
					return false, fmt.Errorf("driver %s failed to unprepare claim %s/%s: %s", driver, pod.Namespace, c.ClaimName, msg)
				}
			}
			logger.Info("Unprepared claims", "pod", klog.KObj(pod), "driver", driver, "claims", len(claims))
		}
		if err := os.RemoveAll(filepath.Join(k.opts.PodsDir, string(pod.UID))); err != nil {
			return false, err
		}
		k.mu.Lock()
		st.Unprepared = true
		k.events = append(k.events, fmt.Sprintf("unprepared %s/%s", pod.Namespace, pod.Name))
		k.cond.Broadcast()
		k.mu.Unlock()
	}
	// The pod object still exists while its deletion waits for the kubelet:
	// confirm it with grace period 0, bound to this UID.
	zero := int64(0)
	err := k.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("finish deletion of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return true, nil
}

// ContainerRoot is the directory that stands for container name's root
// file system of pod uid: a CDI mount at /var/run/x is at ContainerRoot/var/run/x.
func (k *Kubelet) ContainerRoot(uid types.UID, container string) string {
	return filepath.Join(k.opts.PodsDir, string(uid), container, "rootfs")
}

// ContainerEditsOf returns the recorded CDI edits of a container.
func (k *Kubelet) ContainerEditsOf(uid types.UID, container string) (*ContainerEdits, error) {
	data, err := os.ReadFile(filepath.Join(k.opts.PodsDir, string(uid), container+".cdi-edits.json"))
	if err != nil {
		return nil, err
	}
	var e ContainerEdits
	return &e, json.Unmarshal(data, &e)
}

// WaitPrepared waits until pod uid is prepared, or ctx ends (the error then
// carries the last prepare error).
func (k *Kubelet) WaitPrepared(ctx context.Context, uid types.UID) (*PodState, error) {
	return k.waitPod(ctx, uid, func(st *PodState) bool { return st.Prepared })
}

// WaitUnprepared waits until pod uid's claims were unprepared.
func (k *Kubelet) WaitUnprepared(ctx context.Context, uid types.UID) (*PodState, error) {
	return k.waitPod(ctx, uid, func(st *PodState) bool { return st.Unprepared })
}

func (k *Kubelet) waitPod(ctx context.Context, uid types.UID, ok func(*PodState) bool) (*PodState, error) {
	stop := context.AfterFunc(ctx, func() {
		k.mu.Lock()
		k.cond.Broadcast()
		k.mu.Unlock()
	})
	defer stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		st := k.pods[uid]
		if st != nil && ok(st) {
			cp := *st
			return &cp, nil
		}
		if ctx.Err() != nil {
			var last error
			if st != nil {
				last = st.Err
			}
			return nil, fmt.Errorf("pod %s on node %s: %w (last error: %v)", uid, k.opts.NodeName, ctx.Err(), last)
		}
		k.cond.Wait()
	}
}

// WaitRegistered waits until driver has registered at least generation times.
func (k *Kubelet) WaitRegistered(ctx context.Context, driver string, generation int) error {
	stop := context.AfterFunc(ctx, func() {
		k.mu.Lock()
		k.cond.Broadcast()
		k.mu.Unlock()
	})
	defer stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		if dc := k.drivers[driver]; dc != nil && dc.generation >= generation {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("driver %s did not register with node %s (generation %d): %w", driver, k.opts.NodeName, generation, ctx.Err())
		}
		k.cond.Wait()
	}
}

// Registrations returns how often driver registered (0: never).
func (k *Kubelet) Registrations(driver string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if dc := k.drivers[driver]; dc != nil {
		return dc.generation
	}
	return 0
}

// Events lists what the kubelet did, in order ("prepared ns/name", ...).
func (k *Kubelet) Events() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.events...)
}

func (k *Kubelet) driver(name string) (*driverConn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dc := k.drivers[name]
	if dc == nil || dc.client == nil {
		return nil, fmt.Errorf("DRA driver %s is not registered on node %s", name, k.opts.NodeName)
	}
	return dc, nil
}

// dropDriver forgets a connection that failed, so the next registration
// (for example after a driver restart) is dialled afresh.
func (k *Kubelet) dropDriver(name string, dc *driverConn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.drivers[name] == dc && dc.conn != nil {
		dc.conn.Close()
		dc.conn, dc.client = nil, nil
		for p := range k.sockets {
			delete(k.sockets, p) // re-register whatever is there
		}
	}
}

func (k *Kubelet) closeConns() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, dc := range k.drivers {
		if dc.conn != nil {
			dc.conn.Close()
		}
	}
}

// scanRegistrations registers every new or re-created socket in the
// registrar directory (the kubelet's plugin watcher reacts to file creation).
func (k *Kubelet) scanRegistrations(ctx context.Context) {
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(k.opts.RegistrarDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		path := filepath.Join(k.opts.RegistrarDir, e.Name())
		var st syscall.Stat_t
		if syscall.Stat(path, &st) != nil {
			continue
		}
		id := socketID{ino: st.Ino, mtime: st.Mtim.Nano()}
		k.mu.Lock()
		seen := k.sockets[path] == id
		k.mu.Unlock()
		if seen {
			continue
		}
		if err := k.register(ctx, path); err != nil {
			logger.V(2).Info("Registration attempt failed", "socket", path, "err", err)
			continue
		}
		k.mu.Lock()
		k.sockets[path] = id
		k.mu.Unlock()
	}
}

func (k *Kubelet) register(ctx context.Context, regSocket string) error {
	logger := klog.FromContext(ctx)
	conn, err := grpc.NewClient("unix://"+regSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial registration socket %s: %w", regSocket, err)
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The kubelet dials the registration socket with grpc.WithBlock: the
	// file appears at bind(2), a moment before listen(2) accepts.
	info, err := reg.GetInfo(cctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("GetInfo on %s: %w", regSocket, err)
	}
	notify := func(ok bool, msg string) {
		if _, err := reg.NotifyRegistrationStatus(cctx, &registerapi.RegistrationStatus{PluginRegistered: ok, Error: msg}); err != nil {
			logger.Error(err, "NotifyRegistrationStatus", "socket", regSocket)
		}
	}
	if info.Type != registerapi.DRAPlugin {
		notify(false, fmt.Sprintf("plugin type %q is not handled by this kubelet", info.Type))
		return fmt.Errorf("plugin %s has type %q", info.Name, info.Type)
	}
	if !supportsDRAv1(info.SupportedVersions) {
		notify(false, fmt.Sprintf("none of the versions %v is %s", info.SupportedVersions, drapb.DRAPluginService))
		return fmt.Errorf("plugin %s supports %v, not %s", info.Name, info.SupportedVersions, drapb.DRAPluginService)
	}
	endpoint := info.Endpoint
	dra, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		notify(false, err.Error())
		return fmt.Errorf("dial DRA endpoint %s: %w", endpoint, err)
	}
	// Tell the plugin first, then make the registration visible: a
	// caller of WaitRegistered may rely on the plugin knowing it.
	notify(true, "")
	k.mu.Lock()
	dc := k.drivers[info.Name]
	if dc == nil {
		dc = &driverConn{name: info.Name}
		k.drivers[info.Name] = dc
	}
	if dc.conn != nil {
		dc.conn.Close()
	}
	dc.endpoint, dc.conn, dc.client = endpoint, dra, drapb.NewDRAPluginClient(dra)
	dc.generation++
	gen := dc.generation
	k.events = append(k.events, fmt.Sprintf("registered %s", info.Name))
	k.cond.Broadcast()
	k.mu.Unlock()
	logger.Info("Registered DRA driver", "driver", info.Name, "endpoint", endpoint, "generation", gen)
	return nil
}

func supportsDRAv1(versions []string) bool {
	for _, v := range versions {
		if v == drapb.DRAPluginService || strings.HasPrefix(v, "v1.") {
			return true
		}
	}
	return false
}
