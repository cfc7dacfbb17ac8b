// Package layout is the contract between the real-kernel harness (which
// builds the QEMU machine and the guest image) and the guest cases: where
// the emulated devices are and where the guest finds its files.
package layout

// Paths inside the guest.
const (
	// File holds the Layout as JSON.
	File = "/etc/vfnet/layout.json"
	// Driver is the static vfnet-driver binary.
	Driver = "/usr/bin/vfnet-driver"
	// IP is iproute2's ip (busybox's has no `vf` support).
	IP = "/usr/sbin/ip"
	// Busybox is busybox-static.
	Busybox = "/bin/busybox"
	// ModuleOrder lists the guest paths of the kernel modules to load, one a
	// line, dependencies first.
	ModuleOrder = "/lib/modules/order"
	// Kubeconfig is the API server's admin kubeconfig (when the harness
	// started one for the cases that run the real driver).
	Kubeconfig = "/etc/vfnet/kubeconfig"
	// MarkTrace starts the console line carrying the trace case's JSON.
	MarkTrace = "VFNET-TRACE"
	// CasesArg is the kernel command-line parameter listing the cases to
	// run (comma-separated); without it every case runs.
	CasesArg = "vfnet.cases"
	// MarkInitStarted, MarkInitReady and MarkInitFailed start the init's
	// console lines the harness watches to bound the boot.
	MarkInitStarted = "vfnet init: started"
	MarkInitReady   = "vfnet init: machine ready"
	MarkInitFailed  = "vfnet init: machine setup failed"
	// Binding is the static vfnet-binding binary (the vm case).
	Binding = "/usr/bin/vfnet-binding"
	// Launcher is test/kubevirt's kernellauncher: KubeVirt v1.9's converter,
	// hook manager and virt-launcher's define/start steps (the vm case).
	Launcher = "/usr/bin/vfnet-kernellauncher"
	// VMI is the example VM's VMI (manifests/examples/vm.yaml under
	// manifests/kubevirt/binding-patch.yaml), rendered on the host by
	// test/kubevirt's cmd/vmirender with the VM* values below: the launcher
	// reads it instead of linking virt-api.
	VMI = "/etc/vfnet/vmi.json"
	// VMMemory is the VM's guest memory (the example asks 1Gi; the test
	// guest has 2 GiB in all).
	VMMemory = "256Mi"
	// VMKernelArgs boot the VM's kernel (the guest's own) on its serial
	// console, which KubeVirt logs (virt-serial0-log). Under nested TCG
	// its boot is most of the case's cost: the crypto self-tests were a
	// quarter of it, and zeroing every allocation and the Spectre
	// mitigations only slow an emulated CPU that has nothing to protect.
	VMKernelArgs = "console=ttyS0 panic=-1 no_timer_check quiet cryptomgr.notests init_on_alloc=0 mitigations=off"
	// VMKernelDir is where the VM's kernel and initramfs sit in the
	// kernel-boot volume (the VMI's kernelPath and initrdPath).
	VMKernelDir = "/boot"
	// InnerDir holds the VM's own kernel (vmlinux, the guest's kernel) and
	// initramfs (InnerInitrd), the kernel-boot container's files.
	InnerDir = "/usr/share/vfnet-inner"
	// InnerKernel and InnerInitrd are their names in InnerDir.
	InnerKernel = "vmlinux"
	InnerInitrd = "initrd"
	// MarkInner starts the lines the VM's own init prints on its serial console.
	MarkInner = "VFNET-INNER"
	// WireModuleOrder lists, as ModuleOrder does, the modules only the wire
	// case loads (bridge, 8021q, veth, macvlan): the other cases' machine
	// stays as it was.
	WireModuleOrder = "/lib/modules/wire-order"
	// MarkWire starts the wire case's summary line (its measured counts).
	MarkWire = "VFNET-WIRE"
	// MarkFailover starts the failover case's summary line (its measured
	// losses and gaps).
	MarkFailover = "VFNET-FAILOVER"
	// FailoverVMAddr and FailoverPeerAddr are the failover case's
	// addresses: the VM's init puts the first on its failover master (any
	// netdev with slaves and no master of its own), the peer the second.
	FailoverVMAddr   = "10.36.0.2/24"
	FailoverPeerAddr = "10.36.0.1/24"
	// MarkKubelet starts the kubelet case's summary line: JSON of its
	// measured figures (Ready time, idle CPU and RSS, pod start).
	MarkKubelet = "VFNET-KUBELET"
	// MarkWindow starts the lines that open and close a measured window
	// ("VFNET-WINDOW <name> BEGIN|END"): the harness reads QEMU's CPU
	// time at each, the cost of the window to the host.
	MarkWindow = "VFNET-WINDOW"
	// QuietConsoleLevel is the console log level the init sets once the
	// machine is ready: the boot is verbose (a hang shows where it
	// stopped), the cases see only the kernel's warnings and worse.
	QuietConsoleLevel = 4
)

// Roles of the emulated PFs.
const (
	// RoleMain is an igb PF alone behind its own pcie-root-port on the main
	// root complex (NUMA node 0): each VF gets its own IOMMU group.
	RoleMain = "main"
	// RoleNUMA1 is an igb PF behind a root port of a second root complex
	// (pxb-pcie) on NUMA node 1.
	RoleNUMA1 = "numa1"
	// RoleSharedGroup is an igb PF behind a root port without ACS: the PF,
	// its VFs and the port share one IOMMU group.
	RoleSharedGroup = "shared-group"
	// RoleWire is the igb PF on the wire (WirePF), which only a machine
	// with the wire has.
	RoleWire = "wire"
)

// WirePF is the PF a machine with the wire (NeedsWire) gets besides
// Default's: alone behind its own root port on the main root complex, on a
// QEMU hub with the peer NIC (PeerNIC). Not the main PF: with a backend on
// its link, igbvf rebinding without a function-level reset took back a MAC
// it had chosen before as a permanent one, which the crash case, on the
// main PF, then met as an administrative MAC (rehearsals of 2026-12-06,
// twice). The cases on the wire use only this PF. Four VFs, as the main
// PF has: with one, QEMU 10's igb gave the frames a parked VF no longer
// matched to no pool at all, not to the promiscuous PF (the failover
// case lost 144 of 150 pings with the MAC parked, 2026-12-06).
var WirePF = PF{Role: RoleWire, Address: "0000:03:00.0", NUMANode: -1, PCIeRoot: "pci0000:00", VFs: 4}

// PF is one emulated SR-IOV NIC.
type PF struct {
	Role string `json:"role"`
	// Address is the PF's PCI address in the guest.
	Address string `json:"address"`
	// NUMANode and PCIeRoot are what the kernel must report for it and its
	// VFs (NUMANode -1: none).
	NUMANode int    `json:"numaNode"`
	PCIeRoot string `json:"pcieRoot"`
	// VFs is how many VFs the guest's init creates on it.
	VFs int `json:"vfs"`
}

// Layout describes the guest machine.
type Layout struct {
	PFs []PF `json:"pfs"`
	// Cases are the guest cases, in the order init runs them.
	Cases []string `json:"cases"`
	// Peer is the PCI address of the outer NIC that shares WirePF's wire
	// (a QEMU hub), "" when the machine has no wire (PeerNIC).
	Peer string `json:"peer,omitempty"`
	// APIServer is where the guest reaches the harness's API server
	// ("10.0.2.2:<port>": QEMU's user-mode network forwards its host
	// address to the host's loopback), "" when none was started. The
	// kubeconfig names it 127.0.0.1:<port>, as the certificate does.
	APIServer string `json:"apiServer,omitempty"`
}

// Paths of the kubelet case's node (NeedsNode): the programs, by the
// paths their packages install them to, and the images it imports.
const (
	Containerd = "/usr/bin/containerd"
	// ContainerdShim is found by containerd on its PATH, by name.
	ContainerdShim = "/usr/bin/containerd-shim-runc-v2"
	Ctr            = "/usr/bin/ctr"
	Kubelet        = "/usr/bin/kubelet"
	// Runc is Debian's runc with the libraries it needs.
	Runc = "/usr/sbin/runc"
	// CNIBinDir holds Debian's bridge, host-local and loopback plugins.
	CNIBinDir = "/usr/lib/cni"
	// NodeImageDir holds the OCI archives the node imports (no registry).
	NodeImageDir = "/usr/share/vfnet-node/images"
	// NodeModuleOrder lists, as ModuleOrder does, the modules only the
	// kubelet case loads (overlay for containerd's snapshotter, bridge and
	// veth for the CNI bridge).
	NodeModuleOrder = "/lib/modules/node-order"
	// PauseImage is the pod sandbox image (test/node/internal/pause), and
	// BusyboxImage the pod's container (busybox-static).
	PauseImage   = "vfnet.test/pause:1"
	BusyboxImage = "vfnet.test/busybox:1"
)

// GuestAddr and GuestGateway configure the guest's user-mode network
// interface (QEMU's defaults).
const (
	GuestAddr    = "10.0.2.15/24"
	GuestGateway = "10.0.2.2"
)

// NeedsAPIServer reports whether a case runs the real driver, which needs
// a Kubernetes API server.
func NeedsAPIServer(c string) bool {
	return c == "netns" || c == "crash" || c == "numvfs" || c == "events" || c == "vm" || c == "failover" || NeedsNode(c)
}

// NeedsNode reports whether a case runs a real node (containerd, runc and
// the kubelet, joined to the harness's API server); its files make the
// initramfs about 250 MiB larger.
func NeedsNode(c string) bool { return c == "kubelet" || NeedsKubeVirt(c) }

// NeedsKubeVirt reports whether a case is a node of a cluster that runs
// KubeVirt v1.9.0's own components (issue 33 item 3): the real-node tier
// boots the guest for it (make test-kubevirt-guest) with its control plane,
// virt-operator, virt-api and virt-controller on the host; the guest runs
// containerd and the kubelet, and the cluster runs virt-handler, vfnet's
// driver and the VM's launcher pod on them. TestRealKernel cannot run it.
func NeedsKubeVirt(c string) bool { return c == "kubevirt" }

// The kubevirt case's node, as the host's test sees it.
const (
	// GuestNode is the Node the guest's kubelet registers.
	GuestNode = "vfnet-guest"
	// GuestStop is the ConfigMap (namespace default) whose creation
	// ends the kubevirt case: the guest dumps its pods' logs to the
	// console and powers off.
	GuestStop = "vfnet-guest-stop"
	// ServiceIP is the cluster's kubernetes Service address: the guest
	// answers it on its loopback and forwards to the API server.
	ServiceIP = "10.96.0.1"
	// MarkKubeVirt starts the kubevirt case's lines for the host's test
	// (the VM's console, the node's logs at the end).
	MarkKubeVirt = "VFNET-KUBEVIRT"
)

// NeedsWire reports whether a case needs the wire: WirePF on a QEMU hub
// with a second outer NIC (PeerNIC). Without it no PF has a network
// backend at all.
func NeedsWire(c string) bool { return c == "wire" || c == "vm" || c == "failover" || NeedsKubeVirt(c) }

// PeerNIC is the wire's second NIC: a virtio-net-pci on the main root
// complex (virtio_net is loaded anyway, for the user-mode network NIC at
// 00:05.0).
const PeerNIC = "0000:00:06.0"

// NeedsVirt reports whether a case runs libvirt and QEMU inside the guest
// (their files make the initramfs about 250 MiB larger).
func NeedsVirt(c string) bool { return c == "vm" || c == "failover" }

// PF returns the PF with role, or false.
func (l Layout) PF(role string) (PF, bool) {
	for _, p := range l.PFs {
		if p.Role == role {
			return p, true
		}
	}
	return PF{}, false
}

// Default is the machine TestRealKernel boots.
func Default() Layout {
	return Layout{
		PFs: []PF{
			// The main root complex has no ACPI proximity (_PXM): the
			// kernel reports numa_node -1 for everything under it.
			{Role: RoleMain, Address: "0000:01:00.0", NUMANode: -1, PCIeRoot: "pci0000:00", VFs: 4},
			{Role: RoleSharedGroup, Address: "0000:02:00.0", NUMANode: -1, PCIeRoot: "pci0000:00", VFs: 2},
			{Role: RoleNUMA1, Address: "0000:81:00.0", NUMANode: 1, PCIeRoot: "pci0000:80", VFs: 2},
		},
		Cases: AllCases(),
	}
}

// OptInCases run only when VFNET_KERNEL_CASES names them. wire is the
// facts about QEMU's igb that the failover design rests on (issue 36,
// Spike 0); failover is the vm case with an ablation cycle (failover on,
// the MAC not parked), whose figures BENCHMARKS.md records; kubelet
// (issue 33 item 3) is a spike's measurement of a real node's cost under
// TCG.
func OptInCases() []string { return []string{"wire", "failover", "kubelet"} }

// Known reports whether c is a case, in AllCases or OptInCases.
func Known(c string) bool {
	for _, k := range append(append(AllCases(), OptInCases()...), "kubevirt") {
		if k == c {
			return true
		}
	}
	return false
}

// AllCases are the guest cases (issue 11), in run order.
func AllCases() []string {
	return []string{"discovery", "prepare", "refused", "vfio", "autoprobe", "netns", "crash", "sharedgroup", "trace", "recreate", "numvfs", "events", "vm"}
}
