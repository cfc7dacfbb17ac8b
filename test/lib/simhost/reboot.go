package simhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// cloneSpec deep-copies a spec (it holds slices and maps).
func cloneSpec(s Spec) (Spec, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return Spec{}, fmt.Errorf("copy spec: %w", err)
	}
	var out Spec
	if err := json.Unmarshal(b, &out); err != nil {
		return Spec{}, fmt.Errorf("copy spec: %w", err)
	}
	return out, nil
}

// Reboot simulates a node reboot: the kernel starts fresh from the host as
// built. Every function is back on its boot-time driver (VFs re-created by
// the node's boot configuration, probed by their default driver),
// driver_override and new_id entries are gone, VF link settings are the
// PF driver's defaults, netdevs have their boot names, and /dev/vfio holds
// only vfio/vfio; no process holds a group node. IOMMU groups are numbered
// as at build. What lives outside the simulated kernel is the caller's:
// files on disk (the driver's checkpoint) survive, a tmpfs such as the CDI
// directory /var/run/cdi does not (empty it yourself).
func (h *Host) Reboot() error {
	unlock := h.lock()
	defer unlock()
	for g, t := range h.timers {
		t.Stop()
		delete(h.timers, g)
	}
	ents, err := os.ReadDir(h.t.root)
	if err != nil {
		return fmt.Errorf("reboot simulated host: %w", err)
	}
	for _, e := range ents {
		if e.Name() == stateDir {
			continue
		}
		if err := os.RemoveAll(filepath.Join(h.t.root, e.Name())); err != nil {
			return fmt.Errorf("reboot simulated host: %w", err)
		}
	}
	// The simulation's runtime state (VF link settings, a journal, ...)
	// goes too; the lock and host.json (rewritten below) stay.
	states, err := os.ReadDir(filepath.Join(h.t.root, stateDir))
	if err != nil {
		return fmt.Errorf("reboot simulated host: %w", err)
	}
	for _, e := range states {
		if e.Name() == "lock" || e.Name() == "host.json" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(h.t.root, stateDir, e.Name())); err != nil {
			return fmt.Errorf("reboot simulated host: %w", err)
		}
	}
	h.links.cache.m = nil
	for _, d := range []string{filepath.Join(h.devRoot, "vfio"), h.ProcRoot()} {
		if err := os.RemoveAll(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reboot simulated host: %w", err)
		}
	}
	if h.st.Boot != nil {
		spec, err := cloneSpec(*h.st.Boot)
		if err != nil {
			return err
		}
		h.st.Spec = spec
	}
	h.st.DynIDs = nil
	h.index()
	h.building = true
	err = h.build()
	h.building = false
	if err != nil {
		return fmt.Errorf("reboot simulated host: %w", err)
	}
	return h.saveState()
}
