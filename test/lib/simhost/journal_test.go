package simhost

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// snapshot records a tree: every path with its link target or content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == stateDir {
			return filepath.SkipDir
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "-> " + target
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k+": want "+v+", got "+w)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k+": unexpected "+v)
		}
	}
	return out
}

// smallSpec keeps the number of steps per operation low.
func smallSpec(noIOMMU bool) Spec {
	pf := E810PF("0000:3b:00.0", "enp59s0f0", 2)
	pf.TotalVFs = 4
	return Spec{PFs: []PFSpec{pf}, NoIOMMU: noIOMMU}
}

// TestInterruptedOperationsComplete stops each kernel operation after every
// one of its effects in turn (as if the driver process died there), reopens
// the host as a new process would, and checks the tree ends exactly as an
// uninterrupted operation leaves it: the real kernel never leaves a half
// bind behind.
func TestInterruptedOperationsComplete(t *testing.T) {
	t.Parallel()
	const vf = "0000:3b:02.0"
	toVFIOPrep := func(t *testing.T, h *Host) {
		write(t, h, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
		write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	}
	onVFIO := func(t *testing.T, h *Host) {
		toVFIOPrep(t, h)
		write(t, h, "bus/pci/drivers/vfio-pci/bind", vf)
	}
	kw := func(rel, data string) func(h *Host) error {
		return func(h *Host) error { return h.Kernel().WriteFile(rel, []byte(data)) }
	}
	cases := []struct {
		name    string
		noIOMMU bool
		setup   func(*testing.T, *Host)
		op      func(*Host) error
	}{
		{"unbind iavf", false, nil, kw("bus/pci/drivers/iavf/unbind", vf)},
		{"bind vfio-pci", false, toVFIOPrep, kw("bus/pci/drivers/vfio-pci/bind", vf)},
		{"unbind vfio-pci", false, onVFIO, kw("bus/pci/drivers/vfio-pci/unbind", vf)},
		{"bind vfio-pci noiommu", true, toVFIOPrep, kw("bus/pci/drivers/vfio-pci/bind", vf)},
		{"unbind vfio-pci noiommu", true, onVFIO, kw("bus/pci/drivers/vfio-pci/unbind", vf)},
		{"drivers_probe", false, func(t *testing.T, h *Host) {
			write(t, h, "bus/pci/drivers/iavf/unbind", vf)
		}, kw("bus/pci/drivers_probe", vf)},
		{"sriov_numvfs 2 -> 0", false, onVFIO, kw("bus/pci/devices/0000:3b:00.0/sriov_numvfs", "0")},
		{"sriov_numvfs 0 -> 3", false, func(t *testing.T, h *Host) {
			write(t, h, "bus/pci/devices/0000:3b:00.0/sriov_numvfs", "0")
		}, kw("bus/pci/devices/0000:3b:00.0/sriov_numvfs", "3")},
		{"unbind PF driver", false, onVFIO, kw("bus/pci/drivers/ice/unbind", "0000:3b:00.0")},
		{"remove PF", false, onVFIO, func(h *Host) error { return h.RemovePF("0000:3b:00.0") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fresh := func() *Host {
				h := build(t, smallSpec(c.noIOMMU))
				if c.setup != nil {
					c.setup(t, h)
				}
				return h
			}
			ref := fresh()
			if err := c.op(ref); err != nil {
				t.Fatal(err)
			}
			want, wantDev := snapshot(t, ref.Root()), snapshot(t, ref.DevRoot())
			for k := 1; ; k++ {
				h := fresh()
				n := k
				h.t.crash = &n
				finished := func() (done bool) {
					defer func() {
						if r := recover(); r != nil {
							if _, ok := r.(crashed); !ok {
								panic(r)
							}
							done = false
						}
					}()
					if err := c.op(h); err != nil {
						t.Fatalf("op failed without a crash: %v", err)
					}
					return true
				}()
				h.t.crash = nil
				if finished {
					if k == 1 {
						t.Fatal("operation had no effects to interrupt")
					}
					t.Logf("%d interruption points checked", k-1)
					return
				}
				if _, err := os.Stat(h.journalPath()); err != nil {
					t.Fatalf("step %d: no journal left by the interrupted operation", k)
				}
				h.Close()
				// A new process opens the host; its first call completes the op.
				h2, err := Open(h.Root())
				if err != nil {
					t.Fatal(err)
				}
				h2.Kernel().Writes()
				h2.Close()
				if d := diff(want, snapshot(t, h.Root())); d != nil {
					t.Fatalf("interrupted after step %d, sysfs differs:\n%v", k, d)
				}
				if d := diff(wantDev, snapshot(t, h.DevRoot())); d != nil {
					t.Fatalf("interrupted after step %d, /dev differs:\n%v", k, d)
				}
				if _, err := os.Stat(h.journalPath()); err == nil {
					t.Fatalf("step %d: journal left after recovery", k)
				}
			}
		})
	}
}

func TestTornJournalIsIgnored(t *testing.T) {
	t.Parallel()
	h := build(t, smallSpec(false))
	before := snapshot(t, h.Root())
	if err := os.WriteFile(h.journalPath(), []byte(`{"op":"rel`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.Kernel().Writes()
	if !reflect.DeepEqual(before, snapshot(t, h.Root())) {
		t.Fatal("a torn journal changed the tree")
	}
	if _, err := os.Stat(h.journalPath()); err == nil {
		t.Fatal("torn journal not dropped")
	}
}
