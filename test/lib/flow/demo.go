package flow

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

// Demo runs the scenario for a person: it starts a real control plane,
// prints every step, and tears everything down, also on failure and on
// Ctrl-C. The error names the failing step.
func Demo(ctx context.Context, out io.Writer) (retErr error) {
	begin := time.Now()
	// People read the progress lines; component logs stay in their files.
	ctx = klog.NewContext(ctx, logr.Discard())
	fmt.Fprintln(out, "vfnet demo: a real Kubernetes v1.37 control plane (etcd, kube-apiserver, kube-scheduler,")
	fmt.Fprintln(out, "kube-controller-manager) on 127.0.0.1, a simulated SR-IOV node running the real driver (vfnet-driver-sim),")
	fmt.Fprintln(out, "a kubelet stand-in, KubeVirt-shaped VMs and the real vfnet-binding hook sidecar.")
	fmt.Fprintln(out, "==> starting the control plane")
	plane, err := controlplane.Start(ctx, controlplane.Options{HandleSignals: true})
	if err != nil {
		return fmt.Errorf("step \"start the control plane\": %w", err)
	}
	defer func() {
		fmt.Fprintln(out, "==> teardown: stopping drivers, kubelet stand-in and the control plane")
		if err := plane.Stop(); err != nil && retErr == nil {
			retErr = fmt.Errorf("step \"teardown\": %w", err)
		}
	}()
	fmt.Fprintf(out, "    ok: ready in %v at %s\n", plane.StartDuration.Round(time.Millisecond), plane.URL)
	dir, err := WorkDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env, err := NewEnv(plane, dir, out)
	if err != nil {
		return err
	}
	defer env.Close()
	res, err := env.RunScenario(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "==> summary")
	names := make([]string, 0, len(res.PodToPrepared))
	for n := range res.PodToPrepared {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(out, "    %s: pod created -> VF prepared in %v\n", n, res.PodToPrepared[n].Round(time.Millisecond))
	}
	fmt.Fprintf(out, "    control plane start %v; whole demo %v\n", plane.StartDuration.Round(time.Millisecond), time.Since(begin).Round(time.Second))
	return nil
}
