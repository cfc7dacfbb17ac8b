package node

import "testing"

func TestDockerRef(t *testing.T) {
	for in, want := range map[string]string{
		"vfnet-binding:dev":                     "docker.io/library/vfnet-binding:dev",
		"library/x:1":                           "docker.io/library/x:1",
		"vfnet.test/pause:1":                    "vfnet.test/pause:1",
		"quay.io/kubevirt/virt-launcher:v1.9.0": "quay.io/kubevirt/virt-launcher:v1.9.0",
		"localhost/a:b":                         "localhost/a:b",
	} {
		if got := dockerRef(in); got != want {
			t.Errorf("dockerRef(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNodePath(t *testing.T) {
	first := &Node{Dir: "/tmp/n"}
	if got := first.Path("/var/lib/kubelet"); got != "/var/lib/kubelet" {
		t.Errorf("first node maps %q", got)
	}
	second := &Node{Dir: "/tmp/n/realnode-2", mnt: &mountNS{}}
	for in, want := range map[string]string{
		"/var/lib/kubelet/pods": "/tmp/n/realnode-2/varlib/kubelet/pods",
		"/var/run/cdi":          "/tmp/n/realnode-2/run/cdi",
		"/run":                  "/tmp/n/realnode-2/run",
		"/var/log/pods":         "/tmp/n/realnode-2/varlog/pods",
		"/var/libx":             "/var/libx",
		"/etc/hosts":            "/etc/hosts",
	} {
		if got := second.Path(in); got != want {
			t.Errorf("Path(%q) = %q, want %q", in, got, want)
		}
	}
}
