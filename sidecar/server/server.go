package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
)

// DefaultSocketDir is where KubeVirt mounts a hook sidecar's socket directory.
const DefaultSocketDir = "/var/run/kubevirt-hooks"

// stopGrace bounds how long a graceful stop waits for calls in flight.
const stopGrace = 10 * time.Second

// SocketPath is the socket vfnet-binding serves on. virt-launcher
// de-duplicates sockets by file name across all sidecars, so the name
// carries the binding name.
func SocketPath(dir, bindingName string) string {
	return filepath.Join(dir, "vfnet-"+bindingName+".sock")
}

// Config configures a Server.
type Config struct {
	SocketDir   string
	BindingName string
	Reader      domain.MetadataReader
}

// Server serves the hooks API on a unix socket.
type Server struct {
	path     string
	lis      net.Listener
	grpc     *grpc.Server
	stopOnce sync.Once
	stop     chan struct{}
}

// New validates cfg, replaces a stale socket of the same name and listens.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.BindingName == "" || strings.ContainsAny(cfg.BindingName, "/\x00") || cfg.BindingName == "." || cfg.BindingName == ".." {
		return nil, fmt.Errorf("binding name %q (NETWORK_BINDING_PLUGIN_NAME) cannot name a socket file", cfg.BindingName)
	}
	if cfg.Reader == nil {
		return nil, errors.New("no metadata reader configured")
	}
	path := SocketPath(cfg.SocketDir, cfg.BindingName)
	if len(path) >= 108 {
		return nil, fmt.Errorf("socket path %s is %d bytes; unix sockets allow at most 107: use a shorter --socket-dir", path, len(path))
	}
	if err := os.MkdirAll(cfg.SocketDir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory %s: %w", cfg.SocketDir, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	s := &Server{path: path, lis: lis, stop: make(chan struct{})}
	logger := klog.FromContext(ctx)
	s.grpc = grpc.NewServer(grpc.ChainUnaryInterceptor(logCalls(logger), recoverPanics(logger)))
	info.RegisterInfoServer(s.grpc, &Info{Name: cfg.BindingName})
	v1alpha3.RegisterCallbacksServer(s.grpc, &Callbacks{
		BindingName: cfg.BindingName,
		Reader:      cfg.Reader,
		Hostdevs:    domain.NewHostdevCache(),
		OnShutdown:  s.Stop,
	})
	return s, nil
}

func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check for a stale socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Stop asks Serve to stop gracefully; it does not wait.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stop) }) }

// Serve serves until ctx is done or Stop is called (by the Shutdown RPC),
// then stops gracefully and removes the socket. It returns nil after a
// requested stop.
func (s *Server) Serve(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(s.lis) }()
	logger.Info("serving KubeVirt hooks", "socket", s.path)

	var serveErr error
	select {
	case <-ctx.Done():
		logger.Info("stopping", "reason", context.Cause(ctx))
	case <-s.stop:
		logger.Info("stopping", "reason", "Shutdown RPC")
	case serveErr = <-errc:
	}
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopGrace):
		logger.Info("calls still running after the grace period; closing them", "grace", stopGrace)
		s.grpc.Stop()
		<-done
	}
	// GracefulStop closes the listener, which unlinks the socket; remove it
	// explicitly in case it did not (e.g. Serve failed first).
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		logger.Error(err, "remove socket", "socket", s.path)
	}
	if serveErr != nil {
		return fmt.Errorf("serve on %s: %w", s.path, serveErr)
	}
	return nil
}

func logCalls(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, si *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		l := klog.LoggerWithValues(logger, "method", si.FullMethod)
		resp, err := h(klog.NewContext(ctx, l), req)
		if err != nil {
			l.Error(err, "call failed", "duration", time.Since(start))
		} else {
			// No metrics server in a sidecar that runs in every VM pod:
			// the few calls per VM start are logged with their duration.
			l.Info("call done", "duration", time.Since(start))
		}
		return resp, err
	}
}

// recoverPanics turns a panic into an Internal error so that no input can
// take the sidecar (and with it the VM start) down.
func recoverPanics(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, si *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				logger.Error(fmt.Errorf("panic: %v", r), "recovered from a panic; please report it", "method", si.FullMethod, "stack", string(debug.Stack()))
				resp, err = nil, status.Errorf(codes.Internal, "vfnet-binding: internal error in %s (panic: %v); please report it", si.FullMethod, r)
			}
		}()
		return h(ctx, req)
	}
}
