// Command launcherstandin stands in for virt-launcher in the compute
// container of the real-node tier's launcher pod (test/node). Its image
// carries KubeVirt's launcher image name and puts this binary at the path
// the rendered pod runs (/usr/bin/virt-launcher-monitor), so the pod runs as
// KubeVirt v1.9.0's TemplateService rendered it.
//
// It does what virt-launcher does with hook sidecars when a VMI starts,
// with KubeVirt's own code: the converter makes the domain of the VMI
// (baked into the image, -vmi), the hook manager (pkg/hooks) finds the
// sidecars' sockets under /var/run/kubevirt-hooks, waits for the number the
// pod says (--hook-sidecars), calls Info and OnDefineDomain. It prints the
// domain that comes back between marker lines, then waits, as a launcher
// runs its VM, until SIGTERM, when it calls the sidecars' Shutdown hook
// (QEMU exited) and exits. No QEMU or libvirt runs.
//
// The rendered pod runs two more programs of the launcher image, which the
// stand-in image links to this binary: virt-tail (the guest-console-log
// sidecar init container; here it waits for SIGTERM) and container-disk
// (the containerdisk init container's --no-op; here it exits 0).
package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/os/disk"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
)

// Markers around the domain in the container log.
const (
	DomainBegin = "VFNET-STANDIN-DOMAIN-BEGIN"
	DomainEnd   = "VFNET-STANDIN-DOMAIN-END"
	ErrorPrefix = "VFNET-STANDIN-ERROR: "
	ShutdownMsg = "VFNET-STANDIN-SHUTDOWN-CALLED"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	switch filepath.Base(os.Args[0]) {
	case "container-disk":
		if slices.Contains(os.Args[1:], "--no-op") {
			return
		}
		<-sig
		return
	case "virt-tail":
		<-sig
		return
	}
	mgr, err := run(os.Args[1:])
	if err != nil {
		fmt.Println(ErrorPrefix + err.Error())
	}
	<-sig
	if mgr != nil {
		if err := mgr.Shutdown(); err != nil {
			fmt.Println(ErrorPrefix + "hook manager Shutdown: " + err.Error())
			os.Exit(1)
		}
		fmt.Println(ShutdownMsg)
	}
	if err != nil {
		os.Exit(1)
	}
}

func run(args []string) (hooks.Manager, error) {
	vmiFile, sidecars := "/etc/vfnet-standin/vmi.json", 0
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--hook-sidecars":
			n, err := strconv.Atoi(args[i+1])
			if err != nil {
				return nil, fmt.Errorf("--hook-sidecars %q: %w", args[i+1], err)
			}
			sidecars = n
		case "-vmi":
			vmiFile = args[i+1]
		}
	}
	data, err := os.ReadFile(vmiFile)
	if err != nil {
		return nil, err
	}
	vmi := &v1.VirtualMachineInstance{}
	if err := json.Unmarshal(data, vmi); err != nil {
		return nil, fmt.Errorf("VMI %s: %w", vmiFile, err)
	}
	// virt-handler reports each containerDisk's image format; the example
	// VM's is a qcow2 (no disk is read here).
	disks := map[string]*disk.DiskInfo{}
	for _, v := range vmi.Spec.Volumes {
		if v.ContainerDisk != nil {
			disks[v.Name] = &disk.DiskInfo{Format: "qcow2"}
		}
	}
	dom, err := golden.Domain(golden.Case{Name: vmi.Name, VMI: vmi, DisksInfo: disks})
	if err != nil {
		return nil, err
	}
	mgr := hooks.GetManager()
	// virt-launcher waits for its sidecars for minutes before giving up.
	if err := mgr.Collect(uint(sidecars), 4*time.Minute); err != nil {
		return nil, fmt.Errorf("hook manager Collect of %d sidecars: %w", sidecars, err)
	}
	out, err := mgr.OnDefineDomain(&dom.Spec, vmi)
	if err != nil {
		return mgr, fmt.Errorf("hook manager OnDefineDomain: %w", err)
	}
	// What virt-launcher does next with the result.
	var spec api.DomainSpec
	if err := xml.Unmarshal([]byte(out), &spec); err != nil {
		return mgr, fmt.Errorf("unmarshal hook result into api.DomainSpec: %w", err)
	}
	fmt.Println(DomainBegin)
	fmt.Println(out)
	fmt.Println(DomainEnd)
	return mgr, nil
}
