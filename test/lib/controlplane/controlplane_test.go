package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
)

// TestPlane starts a plane and checks what the end-to-end tests rely on:
// RBAC is enforced, pod-bound ServiceAccount tokens carry the node name, and
// Stop leaves no process or directory behind.
func TestPlane(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	p, err := Start(ctx, Options{HandleSignals: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = p.Stop()
		}
	})
	t.Logf("control plane ready in %v", p.StartDuration)
	cs, err := p.AdminClient()
	if err != nil {
		t.Fatal(err)
	}

	// A node, a namespace with a ServiceAccount that may do nothing, and a
	// pod of that SA scheduled to the node.
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "t"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("t").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("t").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{
			NodeName: "node-a", ServiceAccountName: "sa",
			Containers: []corev1.Container{{Name: "c", Image: "none"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token, err := PodBoundToken(ctx, cs, pod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	saClient, err := kubernetes.NewForConfig(p.RESTConfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	review, err := saClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("self subject review with pod-bound token: %v", err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:t:sa" {
		t.Errorf("token user = %q, want system:serviceaccount:t:sa", ui.Username)
	}
	if got := ui.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-a" {
		t.Errorf("token node-name extra = %v, want [node-a]", got)
	}

	// RBAC denies until a role grants.
	if _, err := saClient.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get node without RBAC: err = %v, want Forbidden", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "node-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "node-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "node-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "t", Name: "sa"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "RBAC grant visible", func() error {
		_, err := saClient.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return err
	})

	// kubectl reaches the plane.
	out, err := p.Kubectl(ctx, nil, "get", "nodes", "-o", "name")
	if err != nil || !strings.Contains(string(out), "node/node-a") {
		t.Errorf("kubectl get nodes = %q, %v", out, err)
	}

	// The controller manager runs: the namespace gets its default SA.
	waitFor(ctx, t, "default serviceaccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts("t").Get(ctx, "default", metav1.GetOptions{})
		return err
	})

	var pids []int
	for _, pr := range p.procs {
		pids = append(pids, pr.cmd.Process.Pid)
	}
	dir := p.Dir
	stopped = true
	if err := p.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + itoa(pid)); err == nil {
			t.Errorf("process %d still exists after Stop", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("control-plane dir %s still exists after Stop (err %v)", dir, err)
	}
}

// TestStartFailureCleansUp makes the API server fail to start (a flag it
// rejects) and checks that Start reports its log and leaves nothing behind.
func TestStartFailureCleansUp(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	before := planeDirs(t)
	_, err := Start(ctx, Options{ExtraAPIServerFlags: []string{"--no-such-flag-vfnet"}, StartTimeout: 60 * time.Second})
	if err == nil {
		t.Fatal("Start with a bad apiserver flag succeeded")
	}
	if !strings.Contains(err.Error(), "kube-apiserver exited") || !strings.Contains(err.Error(), "no-such-flag-vfnet") {
		t.Errorf("error does not name the failing component and its log: %v", err)
	}
	for d := range planeDirs(t) {
		if !before[d] {
			// Another parallel test's plane may exist; ours must not.
			if data, rerr := os.ReadFile(d + "/kube-apiserver.log"); rerr == nil && strings.Contains(string(data), "no-such-flag-vfnet") {
				t.Errorf("failed plane left %s behind", d)
			}
		}
	}
}

func TestMissingBinariesMessage(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	_, err := Start(ctx, Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Start with empty bin dir: err = %v, want a missing-binaries error", err)
	}
}

func planeDirs(t *testing.T) map[string]bool {
	t.Helper()
	ds, _ := os.ReadDir(os.TempDir())
	m := map[string]bool{}
	for _, d := range ds {
		if strings.HasPrefix(d.Name(), dirPrefix) {
			m[os.TempDir()+"/"+d.Name()] = true
		}
	}
	return m
}

func waitFor(ctx context.Context, t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestStartRetriesTakenPort: a port taken between its pick and its
// component's bind (another parallel plane) makes Start pick new ports and
// try again, whichever component lost it.
func TestStartRetriesTakenPort(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	var picks [][]int
	pick := func(n int) ([]int, error) {
		ports, err := freePorts(n)
		if err != nil {
			return nil, err
		}
		switch len(picks) {
		case 0:
			ports[0] = takenPort // etcd's client port
		case 1:
			ports[3] = takenPort // kube-scheduler's
		}
		picks = append(picks, ports)
		return ports, nil
	}
	p, err := Start(ctx, Options{pickPorts: pick})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if len(picks) != 3 {
		t.Fatalf("Start picked ports %d times (%v), want 3: etcd's taken, then the scheduler's, then none", len(picks), picks)
	}
	if want := fmt.Sprintf("https://127.0.0.1:%d", picks[2][2]); p.URL != want {
		t.Errorf("plane URL %s, want the last attempt's %s", p.URL, want)
	}
	cs, err := kubernetes.NewForConfig(p.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("the plane started on the third try does not answer: %v", err)
	}
}

// TestPlaneServesKubeVirt: with Options.KubeVirt, what KubeVirt's control
// plane relies on works: the request-header CA is published for aggregated
// servers (virt-api panics without it) and a Deployment gets its pod
// (deployment- and replicaset-controller; it stays Pending, no node).
func TestPlaneServesKubeVirt(t *testing.T) {
	t.Parallel()
	p := StartForTest(t, Options{KubeVirt: true})
	_, ctx := ktesting.NewTestContext(t)
	cs, err := p.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "request-header CA in kube-system/extension-apiserver-authentication", func() error {
		cm, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["requestheader-client-ca-file"] == "" || !strings.Contains(cm.Data["requestheader-allowed-names"], FrontProxyClientName) {
			return fmt.Errorf("no request-header CA for %s: %v", FrontProxyClientName, cm.Data)
		}
		return nil
	})
	one := int32(1)
	labels := map[string]string{"app": "d"}
	_, err = cs.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "d"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the Deployment's pod (deployment-controller, replicaset-controller)", func() error {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=d"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	})
}
