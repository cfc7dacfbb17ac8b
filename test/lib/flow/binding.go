package flow

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"

	hooksinfo "github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	hooksv1alpha3 "github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
)

// BindingResult is one run of vfnet-binding as virt-launcher drives it.
type BindingResult struct {
	HookName  string
	DomainXML string
	Log       string
}

// RunBinding starts the real vfnet-binding binary the way the hook-sidecar-0
// container runs it (NETWORK_BINDING_PLUGIN_NAME=vfnet, the pod's metadata
// mounts as its metadata root), then acts as virt-launcher: finds the socket
// in the hooks directory, calls Info, OnDefineDomain with domainXML and the
// VMI JSON, and Shutdown, and waits for the sidecar to exit.
func (e *Env) RunBinding(ctx context.Context, n *Node, podUID types.UID, vmiJSON, domainXML []byte) (*BindingResult, error) {
	bin, err := e.BinDir(ctx)
	if err != nil {
		return nil, err
	}
	hooksDir, err := os.MkdirTemp(n.Dir, "hk")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(hooksDir)
	logPath := filepath.Join(hooksDir, "..", filepath.Base(hooksDir)+".binding.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	res := &BindingResult{}
	readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	cmd := exec.Command(filepath.Join(bin, "vfnet-binding"), "--socket-dir="+hooksDir,
		"--metadata-root="+n.ContainerMetadataRoot(podUID, "hook-sidecar-0"), "-v=2")
	cmd.Env = append(os.Environ(), "NETWORK_BINDING_PLUGIN_NAME=vfnet", "CONTAINER_NAME=hook-sidecar-0")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start vfnet-binding: %w", err)
	}
	// done is closed when the process is reaped; waitErr is then set.
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()

	// virt-launcher lists the directory and dials every socket in it.
	var sock string
	deadline := time.Now().Add(30 * time.Second)
	for sock == "" {
		entries, _ := os.ReadDir(hooksDir)
		for _, en := range entries {
			if en.Type()&os.ModeSocket != 0 {
				sock = filepath.Join(hooksDir, en.Name())
			}
		}
		if sock != "" {
			break
		}
		select {
		case <-done:
			return nil, fmt.Errorf("vfnet-binding exited before serving: %v\n%s", waitErr, readLog())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("vfnet-binding created no socket in %s\n%s", hooksDir, readLog())
		}
	}
	// Wait for ready, as virt-launcher's blocking dial does: the socket file
	// appears at bind(2), a moment before listen(2) accepts connections.
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute) // virt-launcher's per-call deadline
	defer cancel()
	info, err := hooksinfo.NewInfoClient(conn).Info(cctx, &hooksinfo.InfoParams{})
	if err != nil {
		return nil, fmt.Errorf("hooks Info: %w\n%s", err, readLog())
	}
	res.HookName = info.GetName()
	var points []string
	for _, p := range info.GetHookPoints() {
		points = append(points, p.GetName())
	}
	if !contains(info.GetVersions(), "v1alpha3") || !contains(points, "OnDefineDomain") {
		return nil, fmt.Errorf("vfnet-binding offers versions %v and hook points %v; virt-launcher needs v1alpha3 and OnDefineDomain", info.GetVersions(), points)
	}
	cb := hooksv1alpha3.NewCallbacksClient(conn)
	out, err := cb.OnDefineDomain(cctx, &hooksv1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		return nil, fmt.Errorf("OnDefineDomain: %w\n%s", err, readLog())
	}
	res.DomainXML = string(out.GetDomainXML())
	if contains(points, "Shutdown") {
		if _, err := cb.Shutdown(cctx, &hooksv1alpha3.ShutdownParams{}); err != nil {
			return nil, fmt.Errorf("Shutdown: %w\n%s", err, readLog())
		}
	}
	select {
	case <-done:
		if waitErr != nil {
			return nil, fmt.Errorf("vfnet-binding exit after Shutdown: %w\n%s", waitErr, readLog())
		}
	case <-time.After(20 * time.Second):
		return nil, fmt.Errorf("vfnet-binding did not exit after Shutdown\n%s", readLog())
	}
	res.Log = readLog()
	return res, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// HostdevXML extracts the <hostdev>...</hostdev> element whose alias is
// ua-sriov-<iface> from a domain XML.
func HostdevXML(domain, iface string) (string, bool) {
	rest := domain
	for {
		i := strings.Index(rest, "<hostdev")
		if i < 0 {
			return "", false
		}
		j := strings.Index(rest[i:], "</hostdev>")
		if j < 0 {
			return "", false
		}
		el := rest[i : i+j+len("</hostdev>")]
		if strings.Contains(el, "ua-sriov-"+iface+"'") || strings.Contains(el, `ua-sriov-`+iface+`"`) {
			return el, true
		}
		rest = rest[i+j:]
	}
}
