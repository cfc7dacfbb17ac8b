package controlplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
)

// StartForTest starts a plane for t and stops it in t.Cleanup, also when the
// test fails or is interrupted. Missing binaries fail the test with the
// command that builds them.
func StartForTest(t testing.TB, opts Options) *Plane {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	opts.HandleSignals = true
	p, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	t.Logf("control plane ready in %v at %s", p.StartDuration.Round(time.Millisecond), p.URL)
	return p
}

// PodBoundToken asks the TokenRequest API for a token of ServiceAccount
// namespace/sa bound to pod. When the pod is scheduled to a node (and the
// Node exists), the API server embeds the node, so the token's user carries
// the extra "authentication.kubernetes.io/node-name" — what a DRA driver's
// DaemonSet pod gets from its projected token.
func PodBoundToken(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, expiry time.Duration) (string, error) {
	secs := int64(expiry.Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for serviceaccount %s/%s bound to pod %s: %w", pod.Namespace, pod.Spec.ServiceAccountName, pod.Name, err)
	}
	return tr.Status.Token, nil
}
