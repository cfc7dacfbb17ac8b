package ociimage

import "io/fs"

// Binding runs as KubeVirt's non-root launcher user (qemu, 107:107).
const (
	BindingUID = 107
	BindingGID = 107
)

// Driver is the vfnet-driver image: the static binary and nothing else; it
// runs as root in a privileged pod (manifests/base/daemonset.yaml).
func Driver(ref, arch string, bin []byte) Image {
	return Image{
		Ref:        ref,
		Arch:       arch,
		Files:      []File{{Path: "/usr/bin/vfnet-driver", Mode: 0o755, Data: bin}},
		Entrypoint: []string{"/usr/bin/vfnet-driver"},
	}
}

// Binding is the vfnet-binding image: the static binary, a user database
// naming root and qemu (scratch has none), and the hooks socket directory
// owned by 107:107, running as 107:107.
func Binding(ref, arch string, bin []byte) Image {
	return Image{
		Ref:  ref,
		Arch: arch,
		Files: []File{
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/sbin/nologin\nqemu:x:107:107:qemu:/:/sbin/nologin\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nqemu:x:107:\n")},
			{Path: "/var/run/kubevirt-hooks", Mode: fs.ModeDir | 0o755, UID: BindingUID, GID: BindingGID},
			{Path: "/usr/bin/vfnet-binding", Mode: 0o755, Data: bin},
		},
		Entrypoint: []string{"/usr/bin/vfnet-binding"},
		User:       "107:107",
	}
}
