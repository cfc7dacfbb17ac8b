// Command kernellauncher does, inside the real-kernel test guest, what
// KubeVirt v1.9.0's virt-launcher does to define and start the example VM
// (manifests/examples/vm.yaml) on a real libvirtd (session mode, uid 107)
// with the real vfnet-binding sidecar: KubeVirt's converter, KubeVirt's hook
// manager (pkg/hooks) calling the sidecar on every define, the q35 hotplug
// port allocation, then virDomainCreateWithFlags.
//
// The VMI comes rendered from the host (-vmi, written by cmd/vmirender):
// rendering it runs virt-api's mutators, and linking virt-api would cost
// this launcher its OpenAPI definitions' initialization, 4 s natively and
// one to three minutes under the guest's nested TCG. TestNoVirtAPI keeps it
// out.
//
// It is built static (CGO_ENABLED=0), so KubeVirt's packages that link
// libvirt.org/go/libvirt (the virtwrap manager, virtwrap/network,
// virtwrap/util) cannot be imported: the steps of theirs that matter are
// reproduced here, each naming the function it reproduces, and libvirt is
// reached over its RPC protocol with github.com/digitalocean/go-libvirt.
//
// Output protocol (stdout): one line per step,
//
//	VFNET-LAUNCHER step <name> <duration> <details>
//
// in this order: vmi, kernel-boot-links, private-dir, convert,
// libvirt-connect, hook-collect, lookup, define-1..define-N (each define
// through the hooks, inside allocate-hotplug-ports, details hooks=<time of
// the OnDefineDomain round trip> <why>), allocate-hotplug-ports,
// write-defined, with -migratable-out write-migratable, with -hotplug-check
// hotplug-check (see hotplugCheck),
// then unless -define-only start and write-live (with
// -migration-target: vmi, kernel-boot-links, private-dir, convert,
// hook-collect, target-hooks); a failing
// step prints `step <name> <duration> failed`. The write-* lines summarize
// the XML's pcie-root-ports (root-ports=, free-root-ports=, ports=[index=
// device or free], hostdevs=[alias@bus]). Info lines: `hotplug
// placeholders=.. extra-root-ports=.. pci-devices-counted=.. memory=..`,
// with -v110 `v110 bus-key=.. root-ports=.. with-busNr=.. hotplug-off=[..]
// vf-hostdev-guest-bus-in-spec=..` (the step's decision) and `v110
// hooks-returned sidecars=.. hotplug-off=[..]` (what the sidecars left of
// it), with -cleanup `cleanup: ...` on a failed cleanup. Every change
// cmd/vmirender made to the example VM, just before the vmi step's line:
//
//	VFNET-LAUNCHER change: <what> (<why>)
//
// then exactly one of `VFNET-LAUNCHER OK` (exit 0) or
// `VFNET-LAUNCHER ERROR <msg>` (exit 1), msg naming the step.
//
// What the guest must provide (as a launcher pod does): writable
// /var/run/kubevirt (container-disks/kernel-boot links) and
// /var/run/kubevirt-private; the kernel (and initrd) at
// /var/run/kubevirt-kernel-boot/<the VMI's kernelPath>; the sidecar's socket in a
// directory below /var/run/kubevirt-hooks; a passwd entry for the uid
// (libvirtd refuses a session for a uid without one).
package main

import (
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	v1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	containerdisk "kubevirt.io/kubevirt/pkg/container-disk"
	"kubevirt.io/kubevirt/pkg/defaults"
	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/safepath"
	"kubevirt.io/kubevirt/pkg/unsafepath"
	kutil "kubevirt.io/kubevirt/pkg/util"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/virtio"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/guestvmi"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/pcieports"
)

// Prefix starts every line of the output protocol.
const Prefix = "VFNET-LAUNCHER "

// Constants of KubeVirt v1.9.0's manager.go (hotplug port calculation).
const (
	hotplugLargeMemoryThreshold            = 2 * 1024 * 1024 * 1024
	hotplugLargeMemoryDefaultTotalPorts    = 16
	hotplugLargeMemoryMinRequiredFreePorts = 6
	hotplugDefaultTotalPorts               = 8
	hotplugMinRequiredFreePorts            = 3
	// maxPCIBusIndex: pcie-root-ports sit on bus 0's 32 slots.
	maxPCIBusIndex = 31
)

type config struct {
	vmiFile                   string
	libvirtSocket             string
	hookSidecars              uint
	hookTimeout               time.Duration
	out                       string
	defineOnly, v110, cleanup bool
	v110Bus                   string
	hotplugCheck              bool
	firmwareDirs              string
	migrationTarget           bool
	migratableOut             string
}

func main() {
	var c config
	flag.StringVar(&c.vmiFile, "vmi", "vmi.json", "the VMI rendered on the host by cmd/vmirender (the example VM after virt-controller, virt-api and the guest's changes)")
	flag.StringVar(&c.libvirtSocket, "libvirt-socket", filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "libvirt", "libvirt-sock"), "unix socket of the session libvirtd")
	flag.UintVar(&c.hookSidecars, "hook-sidecars", 1, "hook sidecars the hook manager waits for, each with its socket in a directory below "+hooksDir)
	flag.DurationVar(&c.hookTimeout, "hook-timeout", 2*time.Minute, "how long the hook manager waits for them")
	flag.StringVar(&c.out, "out", "domain.xml", "live domain XML after start; the inactive XML before start goes to <out>.defined")
	flag.BoolVar(&c.defineOnly, "define-only", false, "stop after the last define (write <out>.defined only): a domain with a VFIO hostdev cannot start without VFIO")
	flag.BoolVar(&c.v110, "v110", false, "also apply what KubeVirt's main branch (after v1.9.0, PR 17605) adds to allocateHotplugPorts: hotplug='off' on occupied pcie-root-ports")
	flag.StringVar(&c.v110Bus, "v110-root-port-bus", busFromBusNr, "with -v110, where a pcie-root-port's bus number comes from: "+busFromBusNr+" (<target busNr>, PR 17605 as merged; libvirt never writes it on a root port) or "+busFromIndex+" (the controller index, libvirt's rule; the step then takes effect)")
	flag.BoolVar(&c.hotplugCheck, "hotplug-check", false, "after the last define, check on two started twins of the domain (the VF replaced by an emulated NIC: no VFIO needed) that the VF's root port takes the migration's detach by alias and that the VF can be hot-plugged again")
	flag.StringVar(&c.firmwareDirs, "firmware-dirs", "", "with -hotplug-check, QEMU firmware directories (colon-separated, each passed as -L) when QEMU's own data directory is not where it was built for")
	flag.BoolVar(&c.migrationTarget, "migration-target", false, "prepare a migration target instead of defining (v1.9.0 prepareMigrationTarget): kernel-boot links, private dir, convert, then the hooks' OnDefineDomain, whose result the target discards; libvirt's incoming migration defines the domain from the source's XML")
	flag.StringVar(&c.migratableOut, "migratable-out", "", "after the last define, write the domain's MIGRATABLE XML as v1.9.0's migratableDomXML (live-migration-source.go) passes it on: unmarshalled into libvirtxml.Domain and marshalled back (step write-migratable)")
	flag.BoolVar(&c.cleanup, "cleanup", false, "destroy and undefine the domain before exiting (default: leave it defined and, unless -define-only, running, as virt-launcher would)")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Println(Prefix + "ERROR " + strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	fmt.Println(Prefix + "OK")
}

// hooksDir is where KubeVirt's hook manager looks for sidecar sockets.
const hooksDir = "/var/run/kubevirt-hooks"

// step times fn and prints its line.
func step(name string, fn func() (string, error)) error {
	start := time.Now()
	detail, err := fn()
	d := time.Since(start).Round(100 * time.Microsecond)
	if err != nil {
		fmt.Printf("%sstep %s %s failed\n", Prefix, name, d)
		return fmt.Errorf("step %s: %w", name, err)
	}
	fmt.Printf("%sstep %s %s %s\n", Prefix, name, d, detail)
	return nil
}

type launcher struct {
	c     config
	vmi   *v1.VirtualMachineInstance
	spec  *api.DomainSpec
	virt  *libvirt.Libvirt
	hooks hooks.Manager
	// defines counts defines through the hooks, for the step lines.
	defines int
}

func run(c config) error {
	if c.v110Bus != busFromBusNr && c.v110Bus != busFromIndex {
		return fmt.Errorf("-v110-root-port-bus %q: want %s or %s", c.v110Bus, busFromBusNr, busFromIndex)
	}
	l := &launcher{c: c}
	if err := step("vmi", l.readVMI); err != nil {
		return err
	}
	if err := step("kernel-boot-links", l.linkKernelBootArtifacts); err != nil {
		return err
	}
	if err := step("private-dir", l.privateDir); err != nil {
		return err
	}
	if err := step("convert", l.convert); err != nil {
		return err
	}
	if c.migrationTarget {
		return l.prepareMigrationTarget()
	}
	if err := step("libvirt-connect", l.connect); err != nil {
		return err
	}
	defer l.virt.Disconnect()
	if err := step("hook-collect", l.collect); err != nil {
		return err
	}
	if err := step("lookup", l.lookup); err != nil {
		return err
	}
	var dom libvirt.Domain
	if err := step("allocate-hotplug-ports", func() (string, error) {
		var err error
		dom, err = l.allocateHotplugPorts()
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("defines=%d", l.defines), nil
	}); err != nil {
		return err
	}
	if c.cleanup {
		defer l.cleanup(dom)
	}
	if err := step("write-defined", func() (string, error) { return l.writeXML(dom, libvirt.DomainXMLInactive, c.out+".defined") }); err != nil {
		return err
	}
	if c.migratableOut != "" {
		if err := step("write-migratable", func() (string, error) { return l.writeMigratable(dom, c.migratableOut) }); err != nil {
			return err
		}
	}
	if c.hotplugCheck {
		if err := step("hotplug-check", func() (string, error) { return l.hotplugCheck(dom) }); err != nil {
			return err
		}
	}
	if c.defineOnly {
		return nil
	}
	if err := step("start", func() (string, error) { return l.start(dom) }); err != nil {
		return err
	}
	return step("write-live", func() (string, error) { return l.writeXML(dom, 0, c.out) })
}

// readVMI reads the VMI rendered on the host (cmd/vmirender: the VMI
// virt-controller and virt-api would produce from the example VM, after the
// guest's changes) and prints each change.
func (l *launcher) readVMI() (string, error) {
	f, err := guestvmi.Read(l.c.vmiFile)
	if err != nil {
		return "", fmt.Errorf("-vmi: %w", err)
	}
	for _, c := range f.Changes {
		fmt.Printf("%schange: %s\n", Prefix, c)
	}
	vmi := f.VMI
	l.vmi = vmi
	model, memory := "", "unset"
	if vmi.Spec.Domain.CPU != nil {
		model = vmi.Spec.Domain.CPU.Model
	}
	if vmi.Spec.Domain.Memory != nil && vmi.Spec.Domain.Memory.Guest != nil {
		memory = vmi.Spec.Domain.Memory.Guest.String()
	}
	return fmt.Sprintf("vmi=%s/%s interfaces=%d cpu-model=%q guest-memory=%s", vmi.Namespace, vmi.Name,
		len(vmi.Spec.Domain.Devices.Interfaces), model, memory), nil
}

// linkKernelBootArtifacts reproduces the kernel-boot part of v1.9.0's
// (*LibvirtDomainManager).linkImageVolumeFilePaths (manager.go ~2833): the
// launcher-view directory containerdisk.GetKernelBootArtifactPathFromLauncherView("")
// is created and each artifact there is a symlink to the resolved file in
// the kernel-boot volume view (getKernelBootArtifactPathFromImageVolumeView:
// safepath.JoinAndResolveWithRelativeRoot(kutil.VirtKernelBootVolumeDir, ...)).
// The converter's <kernel>/<initrd> name the launcher-view paths.
func (l *launcher) linkKernelBootArtifacts() (string, error) {
	if !kutil.HasKernelBootContainerImage(l.vmi) {
		return "", errors.New("the VMI has no kernelBoot container (step vmi should have added it)")
	}
	if err := os.MkdirAll(containerdisk.GetKernelBootArtifactPathFromLauncherView(""), 0o755); err != nil {
		return "", fmt.Errorf("create the launcher-view kernel-boot dir: %w (the case must make its parent writable by this user)", err)
	}
	kb := l.vmi.Spec.Domain.Firmware.KernelBoot.Container
	var done []string
	for _, artifact := range []string{kb.KernelPath, kb.InitrdPath} {
		if artifact == "" {
			continue
		}
		link := containerdisk.GetKernelBootArtifactPathFromLauncherView(artifact)
		target, err := safepath.JoinAndResolveWithRelativeRoot(kutil.VirtKernelBootVolumeDir, artifact)
		if err != nil {
			return "", fmt.Errorf("resolve %s in the kernel-boot volume view %s: %w (the case must put the file at %s)",
				artifact, kutil.VirtKernelBootVolumeDir, err, filepath.Join(kutil.VirtKernelBootVolumeDir, artifact))
		}
		if err := os.Symlink(unsafepath.UnsafeAbsolute(target.Raw()), link); err != nil && !os.IsExist(err) {
			return "", fmt.Errorf("link %s: %w", link, err)
		}
		done = append(done, link+" -> "+unsafepath.UnsafeAbsolute(target.Raw()))
	}
	return strings.Join(done, " "), nil
}

// privateDir reproduces the part of virt-launcher's initializeDirs
// (cmd/virt-launcher, InitializePrivateDirectories) this domain needs:
// /var/run/kubevirt-private/<vmi uid>, where the converter puts the serial
// console socket and its log. The other directories it makes serve
// cloud-init, ignition, config and hotplug disks, which this VMI has none of;
// a non-root launcher does not pre-create the console log file.
func (l *launcher) privateDir() (string, error) {
	dir := filepath.Join(kutil.VirtPrivateDir, string(l.vmi.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w (the case must make %s writable by this user, as the launcher pod's emptyDir is)", dir, err, kutil.VirtPrivateDir)
	}
	return dir, nil
}

// convert: KubeVirt's converter with virt-launcher's context (golden) and
// AllowEmulation (KubeVirt's useEmulation) on; the hypervisor device counts
// as available only when this launcher can open it (hypervisorDevice), so
// without a usable KVM the domain is type qemu. Then SyncVMI's
// SetObjectDefaults_Domain (inside golden).
func (l *launcher) convert() (string, error) {
	kvm, why := hypervisorDevice("/dev/kvm")
	convertFn := golden.Domain
	if !kvm {
		convertFn = golden.DomainEmulated
	}
	dom, err := convertFn(golden.Case{Name: l.vmi.Name, VMI: l.vmi})
	if err != nil {
		return "", err
	}
	l.spec = &dom.Spec
	// virt-launcher's preStartHook (manager.go) then does nothing that
	// changes this domain's XML: no cloud-init/ignition/config volumes, no
	// containerDisk overlay (the disk is gone), no disks for
	// SetDriverCacheMode/SetOptimalIOMode, and the network phase 2 has no
	// work for a binding-plugin interface without a domain attachment.
	return fmt.Sprintf("type=%s machine=%s interfaces=%d kernel=%s hypervisor-device=%q", dom.Spec.Type, dom.Spec.OS.Type.Machine,
		len(dom.Spec.Devices.Interfaces), dom.Spec.OS.Kernel, why), nil
}

// hypervisorDevice reports whether the launcher may use KVM, and why.
// v1.9.0's virt-launcher only stats /dev/kvm (newLibvirtDomainManager), which
// in a launcher pod means "usable": the node is there only when KubeVirt's
// device plugin gave it (virt-controller requests it unless useEmulation is
// on) and virt-handler chowned it to the launcher's uid
// (claimDeviceOwnership). This launcher runs on a node's /dev, where a node
// can exist that uid 107 cannot open (root:root 0600, or root:kvm 0660 with
// 107 not in the group): libvirtd would then refuse a type="kvm" domain.
// Opening it read-write, as QEMU does, asks the question the pod's stat
// answers.
func hypervisorDevice(path string) (bool, string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, path + " absent: emulation"
		}
		return false, fmt.Sprintf("%s not usable by uid %d (%v): emulation, as KubeVirt would not give the launcher this node", path, os.Geteuid(), errors.Unwrap(err))
	}
	f.Close()
	return true, path + " usable: kvm"
}

// prepareMigrationTarget reproduces the rest of v1.9.0's
// prepareMigrationTarget (live-migration-target.go) after the conversion:
// the hook sidecars' OnDefineDomain runs "so that additional setup, which
// might be done by the hook can also be done for the new target pod", and
// its domain is discarded. preStartHook changes nothing here (see convert);
// no cloud-init ISO, plugin hooks or migration proxy directory are needed.
func (l *launcher) prepareMigrationTarget() error {
	if err := step("hook-collect", l.collect); err != nil {
		return err
	}
	return step("target-hooks", func() (string, error) {
		if _, err := l.hooks.OnDefineDomain(l.spec, l.vmi); err != nil {
			return "", fmt.Errorf("hook manager OnDefineDomain on the migration target: %w", err)
		}
		return "result discarded, as on KubeVirt's target", nil
	})
}

// connect opens qemu:///session over the given unix socket.
func (l *launcher) connect() (string, error) {
	l.virt = libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(l.c.libvirtSocket), dialers.WithLocalTimeout(10*time.Second)))
	if err := l.virt.ConnectToURI(libvirt.QEMUSession); err != nil {
		return "", fmt.Errorf("connect to %s over %s: %w (is libvirtd running in session mode as this user?)", libvirt.QEMUSession, l.c.libvirtSocket, err)
	}
	v, err := l.virt.ConnectGetLibVersion()
	if err != nil {
		return "", fmt.Errorf("libvirt version: %w", err)
	}
	return fmt.Sprintf("uri=%s socket=%s libvirt=%d.%d.%d", libvirt.QEMUSession, l.c.libvirtSocket, v/1000000, v/1000%1000, v%1000), nil
}

// lookup: lookupOrCreateVirDomain first looks the domain up by name and,
// when it exists, starts that one without defining. That path is not what
// this launcher is for (a fresh VM start), so an existing domain is an error.
func (l *launcher) lookup() (string, error) {
	dom, err := l.virt.DomainLookupByName(l.spec.Name)
	if err == nil {
		return "", fmt.Errorf("domain %s is already defined (uuid %x): undefine it (virsh -c %s undefine %s) or use a fresh libvirtd", l.spec.Name, dom.UUID, libvirt.QEMUSession, l.spec.Name)
	}
	if !libvirt.IsNotFound(err) {
		return "", fmt.Errorf("look up domain %s: %w", l.spec.Name, err)
	}
	return "name=" + l.spec.Name + " not defined yet", nil
}

// collect: virt-launcher's hooks.GetManager().Collect.
func (l *launcher) collect() (string, error) {
	l.hooks = hooks.GetManager()
	if err := l.hooks.Collect(l.c.hookSidecars, l.c.hookTimeout); err != nil {
		return "", fmt.Errorf("hook manager Collect of %d sidecars in %s: %w (KubeVirt's hook manager only dials sockets one directory below %s, as each sidecar's emptyDir is mounted there in a launcher pod: run vfnet-binding with --socket-dir %s/<name>, e.g. %s/hook-sidecar-0)", l.c.hookSidecars, hooksDir, err, hooksDir, hooksDir, hooksDir)
	}
	return fmt.Sprintf("sidecars=%d", l.c.hookSidecars), nil
}

// defineWithHooks reproduces util.SetDomainSpecStrWithHooks: ApplySidecarHooks
// (the hook manager's OnDefineDomain, the result decoded back into the
// caller's spec, which is how the sidecar's hostdev reaches later defines),
// then virConnectDomainDefineXML of the hooks' XML string. The domain plugin
// hooks (plugins.GetPlugins) are empty: no plugin is configured.
func (l *launcher) defineWithHooks(spec *api.DomainSpec, why string) (libvirt.Domain, error) {
	start := time.Now()
	out, err := l.hooks.OnDefineDomain(spec, l.vmi)
	if err != nil {
		return libvirt.Domain{}, fmt.Errorf("define %d (%s): hook manager OnDefineDomain: %w", l.defines+1, why, err)
	}
	hookTime := time.Since(start)
	fromHooks := &api.DomainSpec{}
	if err := xml.Unmarshal([]byte(out), fromHooks); err != nil {
		return libvirt.Domain{}, fmt.Errorf("define %d (%s): decode the hooks' domain into api.DomainSpec: %w", l.defines+1, why, err)
	}
	fromHooks.DeepCopyInto(spec)
	dom, err := l.virt.DomainDefineXML(out)
	if err != nil {
		return libvirt.Domain{}, fmt.Errorf("define %d (%s): libvirt DomainDefineXML: %w", l.defines+1, why, err)
	}
	l.defines++
	fmt.Printf("%sstep define-%d %s hooks=%s %s\n", Prefix, l.defines, time.Since(start).Round(100*time.Microsecond), hookTime.Round(100*time.Microsecond), why)
	return dom, nil
}

// allocateHotplugPorts reproduces v1.9.0's (*LibvirtDomainManager).allocateHotplugPorts
// (manager.go ~1655), which lookupOrCreateVirDomain calls after preStartHook.
func (l *launcher) allocateHotplugPorts() (libvirt.Domain, error) {
	if !defaults.SupportsPCIeHotplug(&l.vmi.Spec) {
		return l.defineWithHooks(l.spec, "no PCIe hotplug topology")
	}
	placeholders, err := placeholderCount(l.vmi)
	if err != nil {
		return libvirt.Domain{}, err
	}
	extra, err := extraControllerCount(l.vmi, l.spec, placeholders)
	if err != nil {
		return libvirt.Domain{}, err
	}
	fmt.Printf("%shotplug placeholders=%d extra-root-ports=%d pci-devices-counted=%d memory=%d%s\n", Prefix,
		placeholders, extra, mustCount(l.spec), l.spec.Memory.Value, l.spec.Memory.Unit)
	dom, err := l.withNetworkIfacesResources(placeholders)
	if err != nil {
		return libvirt.Domain{}, err
	}
	if l.c.v110 {
		return l.finishV110(dom, placeholders, extra)
	}
	// As in v1.9.0: added after the placeholder round, so they get indices
	// above the ports libvirt already assigned and stay empty.
	if extra > 0 {
		appendRootPorts(l.spec, extra)
		if dom, err = l.defineWithHooks(l.spec, fmt.Sprintf("%d extra pcie-root-ports", extra)); err != nil {
			return libvirt.Domain{}, err
		}
	}
	return dom, nil
}

func mustCount(spec *api.DomainSpec) int {
	n, err := converter.CountPCIDevices(spec)
	if err != nil {
		return -1
	}
	return n
}

// placeholderCount reproduces calculatePlaceholderCount: the frozen slot
// total annotation when present, else calculateHotplugPortCountV1
// (max(0, 4-interfaces), 0 without interfaces or on the root complex).
func placeholderCount(vmi *v1.VirtualMachineInstance) (int, error) {
	ifaces := len(vmi.Spec.Domain.Devices.Interfaces)
	if s, ok := vmi.Annotations[v1.PciInterfaceSlotCountAnnotation]; ok {
		total, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("annotation %s=%q is not a number", v1.PciInterfaceSlotCountAnnotation, s)
		}
		return max(0, total-ifaces), nil
	}
	if vmi.Annotations[v1.PlacePCIDevicesOnRootComplex] == "true" || ifaces == 0 {
		return 0, nil
	}
	return max(0, 4-ifaces), nil
}

// extraControllerCount reproduces calculateExtraControllerCount with
// calculateHotplugPortCountV2: desired free ports max(total-inUse, minFree)
// (8/3, or 16/6 above 2 GiB), minus the placeholders. Called, as in
// v1.9.0, on the converter's domain before any hook ran, so a binding
// sidecar's hostdev is not counted in inUse.
func extraControllerCount(vmi *v1.VirtualMachineInstance, spec *api.DomainSpec, placeholders int) (int, error) {
	if vmi.Annotations[v1.PlacePCIDevicesOnRootComplex] == "true" {
		return 0, nil
	}
	total, minFree := hotplugDefaultTotalPorts, hotplugMinRequiredFreePorts
	if spec.Memory.Value > hotplugLargeMemoryThreshold {
		total, minFree = hotplugLargeMemoryDefaultTotalPorts, hotplugLargeMemoryMinRequiredFreePorts
	}
	inUse, err := converter.CountPCIDevices(spec)
	if err != nil {
		return 0, fmt.Errorf("converter.CountPCIDevices: %w", err)
	}
	return max(0, max(total-inUse, minFree)-placeholders), nil
}

// withNetworkIfacesResources reproduces virtwrap/network.WithNetworkIfacesResources
// (nichotplug.go): define a copy with `count` placeholder interfaces
// (AppendPlaceholderInterfacesToTheDomain / newInterfacePlaceholder) so
// libvirt adds a pcie-root-port for each, read the inactive XML back, put the
// original interfaces back into it and take its devices (libvirt's
// controllers and addresses), then define again.
func (l *launcher) withNetworkIfacesResources(count int) (libvirt.Domain, error) {
	if count > 0 {
		withPlaceholders := l.spec.DeepCopy()
		model := virtio.InterpretTransitionalModelType(l.vmi.Spec.Domain.Devices.UseVirtioTransitional, l.vmi.Spec.Architecture)
		for i := 0; i < count; i++ {
			name := fmt.Sprintf("placeholder-%d", i)
			withPlaceholders.Devices.Interfaces = append(withPlaceholders.Devices.Interfaces, api.Interface{
				Type:   "ethernet",
				Model:  &api.Model{Type: model},
				Alias:  api.NewNonUserDefinedAlias(name),
				Target: &api.InterfaceTarget{Device: name, Managed: "no"},
			})
		}
		dom, err := l.defineWithHooks(withPlaceholders, fmt.Sprintf("%d placeholder interfaces", count))
		if err != nil {
			return libvirt.Domain{}, err
		}
		raw, err := l.virt.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
		if err != nil {
			return libvirt.Domain{}, fmt.Errorf("read back the inactive XML of the placeholder domain: %w", err)
		}
		back := &api.DomainSpec{}
		if err := xml.Unmarshal([]byte(raw), back); err != nil {
			return libvirt.Domain{}, fmt.Errorf("decode the inactive XML of the placeholder domain: %w", err)
		}
		back.Devices.Interfaces = l.spec.Devices.Interfaces
		// Only the devices: other sections (e.g. qemu:commandline) are not
		// guaranteed to come back.
		back.Devices.DeepCopyInto(&l.spec.Devices)
	}
	return l.defineWithHooks(l.spec, "placeholders removed, their root ports kept")
}

// appendRootPorts reproduces appendPCIeRootPortControllers: pcie-root-port
// controllers numbered after the highest pci controller index
// (maxPCIControllerIndex), never beyond bus 0's slot 31.
func appendRootPorts(spec *api.DomainSpec, count int) {
	next := 0
	for _, c := range spec.Devices.Controllers {
		if c.Type != "pci" {
			continue
		}
		if i, err := strconv.Atoi(c.Index); err == nil && i > next {
			next = i
		}
	}
	next++
	for i := 0; i < count && next+i <= maxPCIBusIndex; i++ {
		spec.Devices.Controllers = append(spec.Devices.Controllers, api.Controller{
			Type: "pci", Index: strconv.Itoa(next + i), Model: "pcie-root-port",
		})
	}
}

// Skipped from SyncVMI around the define and start, as they change nothing
// for this VMI: ApplyChangedBlockTracking (no CBT), the containerDisk half of
// linkImageVolumeFilePaths (no containerDisk left), FDAssociate of an
// IOMMUFD (only with an iommufd-capable launcher; vfnet's hostdev is legacy
// VFIO), the metadata cache (virt-launcher's own bookkeeping), and after the
// start syncDisks and network.Sync (nothing to hot(un)plug), nor the hooks'
// Shutdown, which virt-launcher calls when QEMU exits, not on start.
//
// start reproduces startDomain's virDomainCreateWithFlags with
// getDomainCreateFlags: paused when the VMI asks to start paused or has a
// dedicated CPU with an isolated emulator thread. generateCloudInitISO has
// nothing to do (no cloud-init volume).
func (l *launcher) start(dom libvirt.Domain) (string, error) {
	flags := libvirt.DomainNone
	if l.vmi.ShouldStartPaused() {
		flags |= libvirt.DomainStartPaused
	}
	if l.vmi.IsCPUDedicated() && l.vmi.Spec.Domain.CPU.IsolateEmulatorThread {
		flags |= libvirt.DomainStartPaused
	}
	if _, err := l.virt.DomainCreateWithFlags(dom, uint32(flags)); err != nil {
		return "", fmt.Errorf("libvirt DomainCreateWithFlags(%d): %w", flags, err)
	}
	state, _, err := l.virt.DomainGetState(dom, 0)
	if err != nil {
		return "", fmt.Errorf("domain state after start: %w", err)
	}
	return fmt.Sprintf("flags=%d state=%d", flags, state), nil
}

// writeXML writes the domain's XML and summarizes its PCIe root ports.
func (l *launcher) writeXML(dom libvirt.Domain, flags libvirt.DomainXMLFlags, file string) (string, error) {
	raw, err := l.virt.DomainGetXMLDesc(dom, flags)
	if err != nil {
		return "", fmt.Errorf("DomainGetXMLDesc(%d): %w", flags, err)
	}
	if err := os.WriteFile(file, []byte(raw), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", file, err)
	}
	r, err := pcieports.Analyze([]byte(raw))
	if err != nil {
		return "", fmt.Errorf("read root ports of %s: %w", file, err)
	}
	return fmt.Sprintf("file=%s %s", file, r), nil
}

// writeMigratable writes what v1.9.0's migratableDomXML makes of the
// domain: GetXMLDesc(MIGRATABLE), unmarshalled into libvirtxml.Domain (the
// version KubeVirt vendors, which this module links) and marshalled back.
// The steps migratableDomXML takes in between (convertDisks, dedicated
// CPUs, local-disk slices) touch no network device and are left out. Here
// the domain is defined, not running: libvirt formats the persistent
// definition for migration.
func (l *launcher) writeMigratable(dom libvirt.Domain, file string) (string, error) {
	raw, err := l.virt.DomainGetXMLDesc(dom, libvirt.DomainXMLMigratable)
	if err != nil {
		return "", fmt.Errorf("DomainGetXMLDesc(MIGRATABLE): %w", err)
	}
	domcfg := &libvirtxml.Domain{}
	if err := domcfg.Unmarshal(raw); err != nil {
		return "", fmt.Errorf("libvirtxml unmarshal of the migratable XML: %w", err)
	}
	out, err := domcfg.Marshal()
	if err != nil {
		return "", fmt.Errorf("libvirtxml marshal of the migratable XML: %w", err)
	}
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", file, err)
	}
	return fmt.Sprintf("file=%s bytes=%d", file, len(out)), nil
}

// cleanup destroys and undefines the domain so the guest can run the case
// again; errors are printed, not returned (the result is already decided).
func (l *launcher) cleanup(dom libvirt.Domain) {
	if active, err := l.virt.DomainIsActive(dom); err == nil && active == 1 {
		if err := l.virt.DomainDestroy(dom); err != nil {
			fmt.Printf("%scleanup: destroy %s: %v\n", Prefix, dom.Name, err)
		}
	}
	if err := l.virt.DomainUndefineFlags(dom, libvirt.DomainUndefineNvram); err != nil {
		fmt.Printf("%scleanup: undefine %s: %v\n", Prefix, dom.Name, err)
	}
}
