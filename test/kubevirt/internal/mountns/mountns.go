// Package mountns runs a process in a private mount namespace where
// /var/run (i.e. /run) is an empty tmpfs and chosen host directories are
// bind-mounted below it.
//
// KubeVirt's hook manager (pkg/hooks GetManager) and its passt binding
// sidecar hard-code /var/run/kubevirt-hooks. Running them unmodified, and
// exactly as in a launcher pod, needs that path to be a per-test directory;
// a private mount namespace gives that without touching the host's /run.
// Needs root (CAP_SYS_ADMIN).
package mountns

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// envSpec carries the child's Spec across the re-exec.
const envSpec = "VFNET_KV_MOUNTNS_SPEC"

// RunDir is the directory replaced by a tmpfs in the namespace.
const RunDir = "/run"

// Bind mounts Source (a host directory) at Target (under /var/run or /run).
type Bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// Spec is what the child sets up before it runs.
type Spec struct {
	Binds []Bind `json:"binds"`
	// Exec, when set, replaces the child process with this command (argv)
	// once the mounts exist, so its PID is the one the parent started.
	Exec []string `json:"exec,omitempty"`
	// Role lets a re-executed test binary pick what to do in the child.
	Role string `json:"role,omitempty"`
}

// Command returns a command that re-runs the current executable in a new
// mount namespace with spec. The executable must call Child early in main
// (or TestMain).
func Command(spec Spec, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable to re-run in a mount namespace: %w", err)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode mount namespace spec: %w", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), envSpec+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// Child reports whether this process was started by Command; if so it has
// set up the mounts and, for a Spec with Exec, does not return on success.
func Child() (Spec, bool, error) {
	raw, ok := os.LookupEnv(envSpec)
	if !ok {
		return Spec{}, false, nil
	}
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return Spec{}, true, fmt.Errorf("decode %s: %w", envSpec, err)
	}
	if err := setup(spec.Binds); err != nil {
		return spec, true, err
	}
	if len(spec.Exec) > 0 {
		env := make([]string, 0, len(os.Environ()))
		for _, e := range os.Environ() {
			if len(e) < len(envSpec)+1 || e[:len(envSpec)+1] != envSpec+"=" {
				env = append(env, e)
			}
		}
		if err := syscall.Exec(spec.Exec[0], spec.Exec, env); err != nil {
			return spec, true, fmt.Errorf("exec %s in mount namespace: %w", spec.Exec[0], err)
		}
	}
	return spec, true, nil
}

func setup(binds []Bind) error {
	// Private first, or the tmpfs and binds would propagate to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private in the new mount namespace (needs root): %w", err)
	}
	if err := syscall.Mount("tmpfs", RunDir, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", RunDir, err)
	}
	for _, b := range binds {
		target, err := underRun(b.Target)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("create bind target %s: %w", target, err)
		}
		if err := syscall.Mount(b.Source, target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", b.Source, target, err)
		}
	}
	return nil
}

// underRun maps /var/run/... to /run/... and refuses anything else: only the
// fresh tmpfs may receive mount points.
func underRun(target string) (string, error) {
	clean := filepath.Clean(target)
	for _, prefix := range []string{"/var/run/", "/run/"} {
		if len(clean) > len(prefix) && clean[:len(prefix)] == prefix {
			return filepath.Join(RunDir, clean[len(prefix):]), nil
		}
	}
	return "", fmt.Errorf("bind target %q must be below /var/run or /run", target)
}
