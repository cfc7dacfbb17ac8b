//go:build kernelguest

package guest

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/pcibind"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// VFIO ioctls (linux/vfio.h: _IO(VFIO_TYPE ';', VFIO_BASE 100 + n)) and
// the structures QEMU passes them.
const (
	vfioGetAPIVersion     = 0x3b64
	vfioCheckExtension    = 0x3b65
	vfioSetIOMMU          = 0x3b66
	vfioGroupGetStatus    = 0x3b67
	vfioGroupSetContainer = 0x3b68
	vfioGroupGetDeviceFD  = 0x3b6a
	vfioDeviceGetInfo     = 0x3b6b
	vfioIOMMUMapDMA       = 0x3b71
	vfioIOMMUUnmapDMA     = 0x3b72

	vfioAPIVersion   = 0
	vfioType1v2IOMMU = 3

	vfioGroupFlagsViable   = 1 << 0
	vfioDMAMapFlagRead     = 1 << 0
	vfioDMAMapFlagWrite    = 1 << 1
	vfioDeviceFlagsPCI     = 1 << 1
	vfioPCINumRegionsAtLst = 9 // BARs 0-5, ROM, config, VGA
)

type vfioGroupStatus struct{ Argsz, Flags uint32 }

type vfioDeviceInfo struct{ Argsz, Flags, NumRegions, NumIRQs uint32 }

type vfioDMAMap struct {
	Argsz, Flags      uint32
	Vaddr, IOVA, Size uint64
}

type vfioDMAUnmap struct {
	Argsz, Flags uint32
	IOVA, Size   uint64
}

func ioctl(fd int, req uintptr, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// Case 4: on a VF pcibind gave to vfio-pci, the calls QEMU makes when a VM
// starts succeed: container, TYPE1v2 IOMMU, group viable and attached,
// device fd, DMA map and unmap.
func TestVFIOCalls(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	vf := pf.VFs[2]
	b := pcibind.Binder{Sysfs: m.sysfs, Writer: sysfs.RootWriter{Root: "/sys"}, DevRoot: "/dev", NodeName: nodeName}
	ctx := context.Background()
	before := m.vfState(t, pf, vf)
	bound, err := b.BindVFIO(ctx, vf.Address, 30*time.Second)
	if err != nil {
		t.Fatalf("BindVFIO: %v", err)
	}
	defer func() {
		if err := b.Restore(ctx, vf.Address, before.Driver, before.Override); err != nil {
			t.Errorf("Restore: %v", err)
		}
		if after := m.vfState(t, pf, vf); after.Driver != before.Driver || after.Override != before.Override {
			t.Errorf("after Restore: %s, before: %s", after, before)
		}
	}()
	t.Logf("bound: group %s node /dev/%s", bound.IOMMUGroup, bound.DevNode)
	for node, perm := range map[string]os.FileMode{"/dev/vfio/vfio": 0o666, "/dev/" + bound.DevNode: 0o600} {
		st, err := os.Stat(node)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeCharDevice == 0 || st.Mode().Perm() != perm {
			t.Errorf("%s: mode %v, want a character device %v", node, st.Mode(), perm)
		}
	}

	container, err := unix.Open("/dev/vfio/vfio", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(container)
	if v, err := ioctl(container, vfioGetAPIVersion, 0); err != nil || v != vfioAPIVersion {
		t.Fatalf("VFIO_GET_API_VERSION = %d, %v", v, err)
	}
	if v, err := ioctl(container, vfioCheckExtension, vfioType1v2IOMMU); err != nil || v != 1 {
		t.Fatalf("VFIO_CHECK_EXTENSION(TYPE1v2) = %d, %v", v, err)
	}
	group, err := unix.Open("/dev/"+bound.DevNode, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(group)
	st := vfioGroupStatus{Argsz: uint32(unsafe.Sizeof(vfioGroupStatus{}))}
	if _, err := ioctl(group, vfioGroupGetStatus, uintptr(unsafe.Pointer(&st))); err != nil {
		t.Fatalf("VFIO_GROUP_GET_STATUS: %v", err)
	}
	if st.Flags&vfioGroupFlagsViable == 0 {
		t.Fatalf("group %s is not viable (flags %#x): a device in it is bound to a host driver", bound.IOMMUGroup, st.Flags)
	}
	cfd := int32(container)
	if _, err := ioctl(group, vfioGroupSetContainer, uintptr(unsafe.Pointer(&cfd))); err != nil {
		t.Fatalf("VFIO_GROUP_SET_CONTAINER: %v", err)
	}
	if _, err := ioctl(container, vfioSetIOMMU, vfioType1v2IOMMU); err != nil {
		t.Fatalf("VFIO_SET_IOMMU(TYPE1v2): %v", err)
	}
	name, err := unix.BytePtrFromString(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	dfd, err := ioctl(group, vfioGroupGetDeviceFD, uintptr(unsafe.Pointer(name)))
	if err != nil {
		t.Fatalf("VFIO_GROUP_GET_DEVICE_FD(%s): %v", vf.Address, err)
	}
	defer unix.Close(int(dfd))
	info := vfioDeviceInfo{Argsz: uint32(unsafe.Sizeof(vfioDeviceInfo{}))}
	if _, err := ioctl(int(dfd), vfioDeviceGetInfo, uintptr(unsafe.Pointer(&info))); err != nil {
		t.Fatalf("VFIO_DEVICE_GET_INFO: %v", err)
	}
	t.Logf("device %s: flags %#x, %d regions, %d irqs", vf.Address, info.Flags, info.NumRegions, info.NumIRQs)
	if info.Flags&vfioDeviceFlagsPCI == 0 || info.NumRegions < vfioPCINumRegionsAtLst || info.NumIRQs == 0 {
		t.Errorf("device info %+v: want a PCI device with >= %d regions and IRQs", info, vfioPCINumRegionsAtLst)
	}

	// Guest RAM as QEMU maps it: anonymous memory, locked by the map.
	const size = 2 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	mp := vfioDMAMap{Argsz: uint32(unsafe.Sizeof(vfioDMAMap{})), Flags: vfioDMAMapFlagRead | vfioDMAMapFlagWrite,
		Vaddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), IOVA: 1 << 30, Size: size}
	if _, err := ioctl(container, vfioIOMMUMapDMA, uintptr(unsafe.Pointer(&mp))); err != nil {
		if err == syscall.ENOMEM {
			t.Fatalf("VFIO_IOMMU_MAP_DMA: %v (RLIMIT_MEMLOCK too low for %d bytes?)", err, size)
		}
		t.Fatalf("VFIO_IOMMU_MAP_DMA: %v", err)
	}
	um := vfioDMAUnmap{Argsz: uint32(unsafe.Sizeof(vfioDMAUnmap{})), IOVA: mp.IOVA, Size: size}
	if _, err := ioctl(container, vfioIOMMUUnmapDMA, uintptr(unsafe.Pointer(&um))); err != nil {
		t.Fatalf("VFIO_IOMMU_UNMAP_DMA: %v", err)
	}
	if um.Size != size {
		t.Errorf("VFIO_IOMMU_UNMAP_DMA unmapped %d bytes, want %d", um.Size, size)
	}
}
