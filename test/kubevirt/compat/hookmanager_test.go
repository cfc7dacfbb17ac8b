package compat

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	drautil "kubevirt.io/kubevirt/pkg/dra"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
)

// TestKubeVirtHookManagerDrivesBinding is the compatibility test: the real
// vfnet-binding binary, discovered and called by KubeVirt v1.9.0's own hook
// manager exactly as virt-launcher does it, on a domain from KubeVirt's
// converter, with metadata that KubeVirt's own pkg/dra reader resolves to
// the same VFs the sidecar writes.
func TestKubeVirtHookManagerDrivesBinding(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	needRoot(t, "KubeVirt's hook manager only scans /var/run/kubevirt-hooks, which this test bind-mounts in a private mount namespace")
	var c golden.Case
	for _, gc := range golden.Cases() {
		if gc.Name == "two-vfnet-masquerade" {
			c = gc
		}
	}
	root := t.TempDir()
	claims, err := c.Claims()
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims {
		if _, err := cl.Write(root); err != nil {
			t.Fatal(err)
		}
	}

	// KubeVirt's own reader must see the VFs we wrote (one template claim,
	// one directly named claim).
	wantBDF := map[string]string{}
	for _, vf := range c.VFs {
		for _, n := range c.VMI.Spec.Networks {
			if n.Name != vf.Interface {
				continue
			}
			bdf, err := drautil.GetPCIAddressForClaim(root, c.VMI.Spec.ResourceClaims, n.ResourceClaim.ClaimName, n.ResourceClaim.RequestName)
			if err != nil {
				t.Fatalf("KubeVirt's pkg/dra reader on %s: %v", vf.Interface, err)
			}
			if bdf != vf.PCIBusID {
				t.Fatalf("KubeVirt's pkg/dra reader: interface %s pciBusID %s, want %s", vf.Interface, bdf, vf.PCIBusID)
			}
			wantBDF["sriov-"+vf.Interface] = bdf
		}
	}

	sc, socketDir := startBinding(t, bin, root, golden.BindingName)
	entries, err := os.ReadDir(socketDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("socket dir holds %d entries, want only the socket (KubeVirt dials every file there)", len(entries))
	}

	outFile := filepath.Join(t.TempDir(), "domain.xml")
	cmd, err := mountns.Command(mountns.Spec{
		Role:  roleLauncher,
		Binds: []mountns.Bind{{Source: socketDir, Target: hookSidecarDir}},
	}, c.Name, outFile)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	// Only bounds a hang: the child initializes KubeVirt's packages, which
	// took nearly 2 minutes beside two make test runs (load 31).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
	if err := cmd.Run(); err != nil {
		t.Fatalf("launcher (KubeVirt hook manager) failed: %v\n%s", err, logs.String())
	}
	out, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sriovHostDevices(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(wantBDF) {
		t.Fatalf("domain after hooks has %d SR-IOV hostdevs, want %d:\n%s", len(got), len(wantBDF), out)
	}
	for _, hd := range got {
		want, ok := wantBDF[hd.Alias.GetName()]
		if !ok {
			t.Errorf("unexpected hostdev alias %s", hd.Alias.GetName())
			continue
		}
		if hd.Source.Address == nil {
			t.Errorf("hostdev %s has no source address", hd.Alias.GetName())
			continue
		}
		src := normalizeAddress(hd.Source.Address)
		wantAddr := normalizeAddress(bdfAddress(t, want))
		// Host address numbers only; the type attribute is discussed at
		// normalizeHostDevices.
		src.Type, wantAddr.Type = "", ""
		if *src != *wantAddr {
			t.Errorf("hostdev %s source %+v, KubeVirt's reader says %s", hd.Alias.GetName(), *src, want)
		}
	}

	// The launcher called Shutdown: the sidecar must exit, and cleanly.
	exitErr, exited := sc.Exited(10 * time.Second)
	if !exited {
		t.Fatal("vfnet-binding still runs 10 s after the hook manager's Shutdown")
	}
	if exitErr != nil {
		t.Errorf("vfnet-binding exited with %v after Shutdown, want 0", exitErr)
	}
}
