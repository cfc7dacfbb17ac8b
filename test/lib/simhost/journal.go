package simhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A real kernel finishes a bind, unbind or SR-IOV change even if the
// writing process is killed halfway. The simulation runs inside the
// driver's process, so it records what it is about to do in
// .simhost/journal.json and the next locked call (from any process) that
// finds the journal completes the operation. The effects are written to be
// idempotent, so re-running one that was half done converges to the same
// tree the uninterrupted call would have left.

type intent struct {
	Op  string `json:"op"` // opProbe, opRelease, opNumVFs, opRemovePF
	Drv string `json:"drv,omitempty"`
	BDF string `json:"bdf"`
	Dir string `json:"dir"`
	N   int    `json:"n,omitempty"`
}

const (
	opProbe    = "probe"
	opRelease  = "release"
	opNumVFs   = "numvfs"
	opRemovePF = "removePF"
)

func (h *Host) journalPath() string { return filepath.Join(h.t.root, stateDir, "journal.json") }

// begin records an operation before its first effect.
func (h *Host) begin(in intent) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return writeAtomic(h.journalPath(), b)
}

// end drops the journal once the operation is complete.
func (h *Host) end() {
	_ = os.Remove(h.journalPath())
}

// recoverJournal completes an operation a dead process left half done.
// The caller holds the lock.
func (h *Host) recoverJournal() error {
	b, err := os.ReadFile(h.journalPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var in intent
	if json.Unmarshal(b, &in) != nil {
		// Torn before the rename: nothing was done yet.
		h.end()
		return nil
	}
	if err := h.collectGroups(); err != nil {
		return err
	}
	if err := h.apply(in); err != nil {
		return fmt.Errorf("complete interrupted simulated %s of %s: %w", in.Op, in.BDF, err)
	}
	h.end()
	return nil
}

// collectGroups drops what an interrupted group creation or removal left:
// member links whose device is gone and groups without members. The kernel
// frees a group with its last device, and without this the lowest-free
// numbering would differ from an uninterrupted run.
func (h *Host) collectGroups() error {
	groups, err := os.ReadDir(h.t.abs(iommuDir))
	if err != nil {
		return nil
	}
	for _, g := range groups {
		dir := iommuDir + "/" + g.Name()
		members, _ := os.ReadDir(h.t.abs(dir + "/devices"))
		live := 0
		for _, m := range members {
			if _, err := os.Stat(h.t.abs(dir + "/devices/" + m.Name())); err != nil {
				if err := h.t.remove(dir + "/devices/" + m.Name()); err != nil {
					return err
				}
				continue
			}
			live++
		}
		if live == 0 {
			if err := h.t.removeAll(dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply performs an operation's effect; it is safe to repeat.
func (h *Host) apply(in intent) error {
	switch in.Op {
	case opProbe:
		if err := h.probe(in.Drv, in.BDF, in.Dir); err != nil {
			return err
		}
		return h.vfDriverProbed(in.Drv, in.BDF, in.Dir)
	case opRelease:
		if err := h.release(in.Drv, in.BDF, in.Dir); err != nil {
			return err
		}
		return h.vfDriverReleased(in.BDF)
	case opNumVFs:
		pf := h.pfs[in.BDF]
		if pf == nil {
			return fmt.Errorf("unknown PF %s", in.BDF)
		}
		// Whatever part of an enable happened, start from no VFs.
		if err := h.disableVFs(pf, in.Dir); err != nil {
			return err
		}
		if err := h.collectGroups(); err != nil {
			return err
		}
		if in.N == 0 {
			return nil
		}
		used, err := h.usedGroups()
		if err != nil {
			return err
		}
		next := h.st.Spec.FirstIOMMUGroup
		return h.enableVFs(pf, in.Dir, in.N, func() int {
			if h.st.Spec.NoIOMMU {
				return -1
			}
			for used[next] {
				next++
			}
			used[next] = true
			return next
		}, false)
	case opRemovePF:
		if pf := h.pfs[in.BDF]; pf != nil {
			if err := h.disableVFs(pf, in.Dir); err != nil {
				return err
			}
		}
		return h.removeFunction(in.BDF, in.Dir)
	}
	return fmt.Errorf("unknown journal op %q", in.Op)
}

// run journals and applies one operation.
func (h *Host) run(in intent) error {
	if err := h.begin(in); err != nil {
		return err
	}
	var before hostSnapshot
	listening := h.hasListeners("uevent-")
	if listening {
		before = h.takeSnapshot()
	}
	err := h.apply(in)
	h.end()
	if listening {
		pf := ""
		if in.Op == opNumVFs && err == nil {
			pf = in.BDF
		}
		h.emitDiff(before, pf)
	}
	return err
}
