// Package app is vfnet-binding's command line: flags, environment, logging
// and the server's lifetime. cmd/vfnet-binding/main.go only wires it to os;
// the hooks server and the domain mutation are sidecar/server and
// sidecar/domain.
package app

import (
	"context"
	"flag"
	"fmt"
	"io"

	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
	"github.com/vfnet-io/vfnet/sidecar/server"
)

// BindingNameEnv is set by virt-controller on every binding sidecar container.
const BindingNameEnv = "NETWORK_BINDING_PLUGIN_NAME"

// DefaultGCPercent is vfnet-binding's GC target when GOGC is not set. The
// sidecar keeps well under 1 MiB live heap and answers a few calls per VM
// start; with Go's default of 100 the heap grows to its 4 MiB minimum goal
// before the first collection and the process keeps those pages. 50 halves
// that minimum, for a little more CPU per call (BENCHMARKS.md: binding-gogc).
const DefaultGCPercent = 50

// GCPercent returns the GC percent vfnet-binding should set:
// DefaultGCPercent, or nothing (false) when GOGC is set, because the runtime
// has then already applied the operator's value.
func GCPercent(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return DefaultGCPercent, true
}

// Options are vfnet-binding's settings.
type Options struct {
	SocketDir    string
	MetadataRoot string
	BindingName  string
}

// Parse reads flags from args and the binding name from getenv.
func Parse(args []string, getenv func(string) string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("vfnet-binding", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Options{}
	fs.StringVar(&o.SocketDir, "socket-dir", server.DefaultSocketDir, "directory to create the hooks socket in (KubeVirt mounts it)")
	fs.StringVar(&o.MetadataRoot, "metadata-root", metadata.DefaultRoot, "where the kubelet mounts DRA device metadata")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.BindingName = getenv(BindingNameEnv)
	if o.BindingName == "" {
		o.BindingName = vmiview.DefaultBindingName
	}
	return o, nil
}

// Run serves until ctx is cancelled (SIGTERM) or virt-launcher calls
// Shutdown; both are a clean exit.
func Run(ctx context.Context, o Options) error {
	logger := klog.FromContext(ctx).WithValues("binding", o.BindingName)
	ctx = klog.NewContext(ctx, logger)
	s, err := server.New(ctx, server.Config{
		SocketDir:   o.SocketDir,
		BindingName: o.BindingName,
		Reader:      metadata.NewCachingReader(o.MetadataRoot),
	})
	if err != nil {
		return err
	}
	logger.Info("vfnet-binding starting", "socket", s.Path(), "metadataRoot", o.MetadataRoot)
	return s.Serve(ctx)
}
