package simhost

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// Links is the simulated VF link layer (what `ip link set <pf> vf <n> ...`
// reaches in the PF driver). It implements vflink.Links. The VF settings are
// kept in <root>/.simhost/vflinks.json, rewritten atomically after every
// change and re-read on every call, so a restarted driver or a test in
// another process sees the same state. One process should change a host at
// a time; calls from several processes are still serialised by flock.
//
// Modelled kernel behaviour:
//   - netdevs are looked up in the namespace the link layer was opened on
//     (Host.Links: the host's; Host.LinksAt: any): a netdev that is not
//     there fails with *vflink.LinkNotFoundError (ENODEV);
//   - the PF is looked up by netdev name (class/net/<pf>, and it must be an
//     SR-IOV PF): otherwise ENODEV; a VF index >= sriov_numvfs is EINVAL;
//   - VF reads go through vflink.Reader over a simulated rtnetlink socket
//     (rtnl.go): the kernel's RTM_NEWLINK reply is built byte for byte as
//     rtnl_fill_ifinfo lays it out, honouring IFLA_EXT_MASK (VF list,
//     per-VF statistics), with 16-bit nest lengths that wrap, and is
//     delivered as one datagram that a short receive buffer cuts;
//   - the kernel's field widths: VLAN, qos and the rates cross netlink as
//     u32 (a value past 32 bits arrives cut to its low 32 bits, a negative
//     one wrapped); VLAN above 4095 (12 bits), qos above 7 (3 bits), qos
//     without a VLAN, and protocols other than 802.1Q/802.1ad are rejected
//     (EINVAL, EPROTONOSUPPORT for the protocol);
//   - a MAC must be 6 bytes and unicast; all-zero clears the admin MAC, as
//     ice, mlx5 and igb accept;
//   - min rate <= max rate unless max is 0 (no limit);
//   - link state auto/enable/disable;
//   - an InfiniBand PF (netdev type 32, IPoIB) supports only reading VFs and
//     the link state; the other setters fail with EOPNOTSUPP.
//
// The PF shows the MAC a VF driver chose for itself while no MAC is set
// administratively: a VF driver (iavf, igbvf, ...) bound by an explicit
// bind, drivers_probe or new_id reports its netdev's address to the PF,
// and the PF keeps showing it after the driver lets go (also with the VF
// on vfio-pci: only a function-level reset clears it on igb) until an
// administrator sets a MAC. The VF netdev's addr_assign_type tells the two
// apart: 1 (random) for a MAC the VF driver chose, 0 for one from the PF. Host.VFState shows the administrative state
// only. With SetVFResets, MAC, VLAN and trust changes and VF driver
// changes put the VF in reset for a while; settings made meanwhile fail
// with EBUSY (EAGAIN on i40e), as Intel's PF drivers answer.
//
// A VF nobody configured reads as the kernel shows it after SR-IOV enable:
// MAC 00:00:00:00:00:00, VLAN 0, qos 0, 802.1Q, spoofchk on, trust off,
// link auto, no rate limits. Disabling SR-IOV on the PF forgets the settings.
// Setting a MAC also changes the address of the VF's netdev, if it has one.
type Links struct {
	h *Host
	// netns is the namespace file this link layer was opened on, nsID
	// the namespace's identity (see LinksAt).
	netns, nsID string

	fails []failRule
	cache struct {
		ino, size, mtime int64
		m                map[string]vflink.VFState
	}
}

var _ vflink.Links = (*Links)(nil)

// Link operation names for Fail.
const (
	OpVF           = "VF"
	OpSetMAC       = "SetMAC"
	OpSetVLAN      = "SetVLAN"
	OpSetSpoofChk  = "SetSpoofChk"
	OpSetTrust     = "SetTrust"
	OpSetLinkState = "SetLinkState"
	OpSetRate      = "SetRate"
)

// Fail makes the next count calls of op (OpSetMAC, ...) fail with errno
// before any effect (count < 0: every call).
func (l *Links) Fail(op string, errno syscall.Errno, count int) {
	unlock := l.h.lock()
	defer unlock()
	l.fails = append(l.fails, failRule{op: op, errno: errno, remain: count})
}

// DefaultVFState is what an unconfigured VF reports.
func DefaultVFState() vflink.VFState {
	return vflink.VFState{MAC: make(net.HardwareAddr, 6), VLANProto: vflink.VLANProto8021Q, SpoofChk: true,
		LinkState: vflink.LinkStateAuto}
}

func key(pf string, vf int) string { return pf + "/" + strconv.Itoa(vf) }

func (l *Links) statePath() string { return filepath.Join(l.h.t.root, stateDir, "vflinks.json") }

// load reads the state file, cached by inode, size and mtime: the file is
// replaced by rename, so another process's change shows in the stat.
func (l *Links) load() (map[string]vflink.VFState, error) {
	p := l.statePath()
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]vflink.VFState{}, nil
	}
	if err != nil {
		return nil, err
	}
	var ino int64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = int64(sys.Ino)
	}
	if l.cache.m != nil && l.cache.ino == ino && l.cache.size == st.Size() && l.cache.mtime == st.ModTime().UnixNano() {
		return cloneStates(l.cache.m), nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := map[string]vflink.VFState{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("simulated VF link state %s is corrupt: %w", p, err)
	}
	l.cache.ino, l.cache.size, l.cache.mtime, l.cache.m = ino, st.Size(), st.ModTime().UnixNano(), m
	return cloneStates(m), nil
}

func cloneStates(m map[string]vflink.VFState) map[string]vflink.VFState {
	out := make(map[string]vflink.VFState, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (l *Links) save(m map[string]vflink.VFState) error {
	// encoding/json writes map keys sorted, so the file is stable.
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	l.cache.m = nil
	return writeAtomic(l.statePath(), b)
}

// peek returns the stored state of a VF (caller holds the lock).
func (l *Links) peek(pf string, vf int) (vflink.VFState, bool) {
	m, err := l.load()
	if err != nil {
		return vflink.VFState{}, false
	}
	st, ok := m[key(pf, vf)]
	return st, ok
}

// forgetPF drops the settings of every VF of pf (SR-IOV disabled).
func (l *Links) forgetPF(pf string) error {
	m, err := l.load()
	if err != nil {
		return err
	}
	changed := false
	for k := range m {
		if strings.HasPrefix(k, pf+"/") {
			delete(m, k)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return l.save(m)
}

// check finds the PF and VF as the kernel would (caller holds the lock).
func (l *Links) check(op, pf string, vf int) (pfDir string, err error) {
	if errno, ok := takeFail(l.fails, func(o string) bool { return o == op }); ok {
		return "", errno
	}
	t := l.h.t
	nd, err := t.readlink(classNet + "/" + pf)
	if !l.inHostNetns() || pf == "" || strings.ContainsRune(pf, '/') || err != nil || !t.exists(nd) {
		return "", l.notFound(pf)
	}
	pfDir = nd[:strings.LastIndex(nd, "/net/")]
	n, err := t.read(pfDir + "/sriov_numvfs")
	if err != nil {
		// Not an SR-IOV PF: the driver has no ndo_set_vf_* (EOPNOTSUPP).
		return "", syscall.EOPNOTSUPP
	}
	num, _ := strconv.Atoi(n)
	if vf < 0 || vf >= num {
		return "", syscall.EINVAL
	}
	if op != OpVF && op != "" {
		drv, _ := t.readlink(pfDir + "/driver")
		if err := l.h.inReset(l.h.vfAddr(pfDir, vf), path.Base(drv)); err != nil {
			return "", err
		}
	}
	if op != OpVF && op != OpSetLinkState && op != "" {
		// IPoIB netdevs only offer VF link state and GUIDs
		// (ipoib_netdev_ops_pf): MAC, VLAN, spoofchk, trust and rate are
		// not supported.
		if t, _ := t.read(nd + "/type"); t == "32" {
			return "", syscall.EOPNOTSUPP
		}
	}
	return pfDir, nil
}

// reported is VF vf of the PF at pfDir (netdev pf) as the PF reports it:
// its administrative settings, and while no MAC is set administratively,
// the MAC the VF's own driver chose (rt: the runtime state, loadRuntime;
// caller holds the lock).
func (l *Links) reported(m map[string]vflink.VFState, rt map[string]vfRuntime, pf, pfDir string, vf int) vflink.VFState {
	st := l.get(m, pf, vf)
	st.MAC = append(net.HardwareAddr(nil), st.MAC...)
	if isZeroMAC(st.MAC) && len(rt) > 0 {
		if own := rt[l.h.vfAddr(pfDir, vf)].OwnMAC; own != nil {
			st.MAC = append(net.HardwareAddr(nil), own...)
		}
	}
	return st
}

func (l *Links) get(m map[string]vflink.VFState, pf string, vf int) vflink.VFState {
	if st, ok := m[key(pf, vf)]; ok {
		return st
	}
	return DefaultVFState()
}

// update runs fn on the VF's state under the lock and persists it.
func (l *Links) update(op, pf string, vf int, fn func(st *vflink.VFState, pfDir string) error) error {
	unlock := l.h.lock()
	defer unlock()
	pfDir, err := l.check(op, pf, vf)
	if err != nil {
		return fmt.Errorf("simulated %s on %s vf %d: %w", op, pf, vf, err)
	}
	m, err := l.load()
	if err != nil {
		return err
	}
	st := l.get(m, pf, vf)
	if err := fn(&st, pfDir); err != nil {
		return fmt.Errorf("simulated %s on %s vf %d: %w", op, pf, vf, err)
	}
	m[key(pf, vf)] = st
	if err := l.save(m); err != nil {
		return err
	}
	// The kernel notifies RTM_NEWLINK of the PF after a setlink.
	l.h.linkChanged(pf, false)
	switch op {
	case OpSetMAC, OpSetVLAN, OpSetTrust:
		// i40e and ice reset the VF to apply these.
		return l.h.startReset(l.h.vfAddr(pfDir, vf))
	}
	return nil
}

// VF implements vflink.Links: vflink's own reader asks the simulated
// kernel over a simulated rtnetlink socket.
func (l *Links) VF(pf string, vf int) (vflink.VFState, error) {
	unlock := l.h.lock()
	defer unlock()
	st, err := l.reader().VF(pf, vf)
	if err != nil {
		return vflink.VFState{}, fmt.Errorf("simulated VF read on %s vf %d: %w", pf, vf, err)
	}
	return st, nil
}

// VFs reads every VF of pf in one request, as vflink.Reader.VFs does.
func (l *Links) VFs(pf string) ([]vflink.VFState, error) {
	unlock := l.h.lock()
	defer unlock()
	sts, err := l.reader().VFs(pf)
	if err != nil {
		return nil, fmt.Errorf("simulated VF read on %s: %w", pf, err)
	}
	return sts, nil
}

// Resolve implements vflink.Links.
func (l *Links) Resolve(name string) (vflink.Netdev, error) {
	unlock := l.h.lock()
	defer unlock()
	return l.reader().Resolve(name)
}

// Conn is a simulated rtnetlink socket in this link layer's namespace,
// for tests that drive vflink.Reader or send their own requests. Every
// Send and Recv takes the host lock.
func (l *Links) Conn() vflink.Conn { return lockedConn{l: l, c: &rtnlConn{l: l}} }

type lockedConn struct {
	l *Links
	c *rtnlConn
}

func (c lockedConn) Send(msg []byte) error {
	unlock := c.l.h.lock()
	defer unlock()
	return c.c.Send(msg)
}

func (c lockedConn) Recv(b []byte, peek bool) (int, error) {
	unlock := c.l.h.lock()
	defer unlock()
	return c.c.Recv(b, peek)
}

func isZeroMAC(mac net.HardwareAddr) bool { return bytes.Equal(mac, make(net.HardwareAddr, len(mac))) }

// SetMAC implements vflink.Links.
func (l *Links) SetMAC(pf string, vf int, mac net.HardwareAddr) error {
	return l.update(OpSetMAC, pf, vf, func(st *vflink.VFState, pfDir string) error {
		if len(mac) != 6 || mac[0]&1 == 1 {
			return syscall.EINVAL
		}
		st.MAC = append(net.HardwareAddr(nil), mac...)
		// The PF overwrites what the VF driver reported (one MAC per VF).
		if err := l.h.changeRuntime(l.h.vfAddr(pfDir, vf), func(r *vfRuntime) { r.OwnMAC = nil }); err != nil {
			return err
		}
		// The VF's netdev takes the new address (the PF resets the VF).
		if vfDir, err := l.h.t.readlink(pfDir + "/virtfn" + strconv.Itoa(vf)); err == nil {
			ents, _ := os.ReadDir(l.h.t.abs(vfDir + "/net"))
			for _, e := range ents {
				addr, assign := mac.String(), "0"
				if isZeroMAC(mac) {
					addr, assign = derivedMAC(filepath.Base(vfDir), 0), "1"
				}
				if err := l.h.t.write(vfDir+"/net/"+e.Name()+"/address", addr+"\n", 0o444); err != nil {
					return err
				}
				if err := l.h.t.write(vfDir+"/net/"+e.Name()+"/addr_assign_type", assign+"\n", 0o444); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// SetVLAN implements vflink.Links.
func (l *Links) SetVLAN(pf string, vf int, vlan, qos int, proto string) error {
	return l.update(OpSetVLAN, pf, vf, func(st *vflink.VFState, pfDir string) error {
		// struct ifla_vf_vlan_info carries vlan and qos as u32 (netlink
		// converts the ints); the kernel refuses vlan > 4095 (12 bits) and
		// qos > 7 (3 bits), so a negative value is refused too, and a value
		// past 32 bits arrives cut to its low bits. A priority without a
		// VLAN (vlan 0, qos 3) is accepted: igb reports qos 3 then (seen
		// on the real kernel, test/kernel/scenario), and i40e, ice and
		// mlx5 check only the field widths too.
		vlan, qos = int(uint32(vlan)), int(uint32(qos))
		if vlan > 4095 || qos > 7 {
			return syscall.EINVAL
		}
		if proto == "" {
			proto = vflink.VLANProto8021Q
		}
		if proto != vflink.VLANProto8021Q && proto != vflink.VLANProto8021AD {
			return syscall.EPROTONOSUPPORT
		}
		if err := l.model(pfDir, pf).vlan(proto); err != nil {
			return err
		}
		st.VLAN, st.QoS, st.VLANProto = vlan, qos, proto
		return nil
	})
}

// SetSpoofChk implements vflink.Links.
func (l *Links) SetSpoofChk(pf string, vf int, on bool) error {
	return l.update(OpSetSpoofChk, pf, vf, func(st *vflink.VFState, _ string) error {
		st.SpoofChk = on
		return nil
	})
}

// SetTrust implements vflink.Links.
func (l *Links) SetTrust(pf string, vf int, on bool) error {
	return l.update(OpSetTrust, pf, vf, func(st *vflink.VFState, _ string) error {
		st.Trust = on
		return nil
	})
}

// SetLinkState implements vflink.Links.
func (l *Links) SetLinkState(pf string, vf int, state string) error {
	return l.update(OpSetLinkState, pf, vf, func(st *vflink.VFState, pfDir string) error {
		if err := l.model(pfDir, pf).linkState(); err != nil {
			return err
		}
		switch state {
		case vflink.LinkStateAuto, vflink.LinkStateEnable, vflink.LinkStateDisable:
			st.LinkState = state
			return nil
		}
		return syscall.EINVAL
	})
}

// SetRate implements vflink.Links.
func (l *Links) SetRate(pf string, vf int, minMbps, maxMbps int) error {
	return l.update(OpSetRate, pf, vf, func(st *vflink.VFState, pfDir string) error {
		// struct ifla_vf_rate holds u32 rates: netlink cuts an int to its
		// low 32 bits (4294967396 arrives as 100, -1 as 4294967295) and
		// rtnetlink compares the u32 values.
		minMbps, maxMbps = int(uint32(minMbps)), int(uint32(maxMbps))
		if maxMbps != 0 && minMbps > maxMbps {
			return syscall.EINVAL
		}
		m, err := l.load()
		if err != nil {
			return err
		}
		stored, err := l.model(pfDir, pf).rate(minMbps, maxMbps, minRateOthers(m, pf, vf))
		if err != nil {
			return err
		}
		st.MinTxRateMbps, st.MaxTxRateMbps = minMbps, stored
		return nil
	})
}

// VFState reads a VF's administrative settings, as the PF driver holds
// them, without failure injection or reset windows (for tests). Unlike
// Links.VF it does not show the MAC a VF driver chose for itself: a VF
// whose MAC nobody set reads 00:00:00:00:00:00 here whatever its driver
// did, which is what "restored exactly" compares.
func (h *Host) VFState(pf string, vf int) (vflink.VFState, error) {
	unlock := h.lock()
	defer unlock()
	if _, err := h.links.check("", pf, vf); err != nil {
		return vflink.VFState{}, fmt.Errorf("VF state of %s vf %d: %w", pf, vf, err)
	}
	m, err := h.links.load()
	if err != nil {
		return vflink.VFState{}, err
	}
	return h.links.get(m, pf, vf), nil
}

// VFStateOf is VFState for the VF at address bdf, through its PF.
func (h *Host) VFStateOf(bdf string) (vflink.VFState, error) {
	pf, i := h.vfOf(bdf)
	if pf == nil {
		return vflink.VFState{}, fmt.Errorf("VF state of %s: no PF of this host has that VF", bdf)
	}
	return h.VFState(pf.NetDev, i)
}
