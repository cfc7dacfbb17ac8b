package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
)

// buildBinary builds cmd/vfnet-binding the way an image build does.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	repo, err := gobuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := gobuild.Shipped(t.Context(), repo, "./cmd/vfnet-binding")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "vfnet-binding")
}

type proc struct {
	cmd    *exec.Cmd
	socket string
	log    *strings.Builder
	exited chan error
}

func startBinary(t *testing.T, bin, bindingName, metadataRoot string) *proc {
	t.Helper()
	dir, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &proc{socket: filepath.Join(dir, "vfnet-"+bindingName+".sock"), log: &strings.Builder{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, "--socket-dir", dir, "--metadata-root", metadataRoot, "-v", "2")
	p.cmd.Env = append(os.Environ(), "NETWORK_BINDING_PLUGIN_NAME="+bindingName)
	p.cmd.Stderr, p.cmd.Stdout = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
		}
	})
	// Wait for the socket the way virt-launcher does: poll the directory.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(p.socket); err == nil {
			return p
		}
		select {
		case err := <-p.exited:
			t.Fatalf("vfnet-binding exited before serving: %v\n%s", err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket %s after 30s\n%s", p.socket, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("vfnet-binding exit: %v (want 0)\n%s", err, p.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("vfnet-binding still running 30s after stop\n%s", p.log)
	}
	if _, err := os.Stat(p.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	// Wait for ready, as virt-launcher's blocking dial does: the socket file
	// appears at bind(2), a moment before listen(2) accepts connections.
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestBinaryExitsZero(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)

	t.Run("SIGTERM", func(t *testing.T) {
		t.Parallel()
		p := startBinary(t, bin, "vfnet", t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := info.NewInfoClient(dial(t, p.socket)).Info(ctx, &info.InfoParams{})
		if err != nil || res.GetName() != "vfnet" {
			t.Fatalf("Info = %v, %v", res, err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		p.wait(t)
	})

	t.Run("Shutdown RPC, custom binding name", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		p := startBinary(t, bin, "sriov-fast", root)
		if filepath.Base(p.socket) != "vfnet-sriov-fast.sock" {
			t.Fatalf("socket %s", p.socket)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn := dial(t, p.socket)
		res, err := info.NewInfoClient(conn).Info(ctx, &info.InfoParams{})
		if err != nil || res.GetName() != "sriov-fast" {
			t.Fatalf("Info = %v, %v", res, err)
		}
		// One real OnDefineDomain through the binary, binding name from env.
		sidecartest.WriteVF(t, root, "net", "vf", "0000:3b:02.1", "")
		vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Build()
		vmi.Spec.Domain.Devices.Interfaces[1].Binding.Name = "sriov-fast"
		vj, _ := json.Marshal(vmi)
		cb := v1alpha3.NewCallbacksClient(conn)
		out, err := cb.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: sidecartest.ReadFile(t, "../../../sidecar/domain/testdata/q35.xml"), Vmi: vj})
		if err != nil || !strings.Contains(string(out.GetDomainXML()), "ua-sriov-dra-net") {
			t.Fatalf("OnDefineDomain: %v", err)
		}
		if _, err := cb.Shutdown(ctx, &v1alpha3.ShutdownParams{}); err != nil {
			t.Fatal(err)
		}
		p.wait(t)
	})
}
