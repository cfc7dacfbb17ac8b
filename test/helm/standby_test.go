package helm

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// driver.standby: on by default (the kustomize tree's args and mount,
// TestChartMatchesKustomize); another socket moves the flag and the
// mounted directory together; off renders --standby-nri=false and mounts
// nothing.
func TestStandbyValues(t *testing.T) {
	for _, tc := range []struct {
		name     string
		standby  map[string]any
		wantArg  string
		wantPath string // "" = no nri volume
	}{
		{"default", nil, "--nri-socket=/var/run/nri/nri.sock", "/var/run/nri"},
		{"socket", map[string]any{"nriSocket": "/run/containerd/nri/nri.sock"}, "--nri-socket=/run/containerd/nri/nri.sock", "/run/containerd/nri"},
		{"off", map[string]any{"nri": false}, "--standby-nri=false", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			if tc.standby != nil {
				vals["driver"] = map[string]any{"standby": tc.standby}
			}
			objs, err := ByKey(render(t, namespace, vals).Objects)
			if err != nil {
				t.Fatal(err)
			}
			ds := &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs["DaemonSet vfnet-system/vfnet-driver"].Object, ds); err != nil {
				t.Fatal(err)
			}
			spec := ds.Spec.Template.Spec
			ctr := spec.Containers[0]
			if !slices.Contains(ctr.Args, tc.wantArg) {
				t.Errorf("args %q lack %s", ctr.Args, tc.wantArg)
			}
			var path, mount string
			for _, v := range spec.Volumes {
				if v.Name == "nri" && v.HostPath != nil {
					path = v.HostPath.Path
				}
			}
			for _, m := range ctr.VolumeMounts {
				if m.Name == "nri" {
					mount = m.MountPath
				}
			}
			if path != tc.wantPath || mount != tc.wantPath {
				t.Errorf("nri volume %q mounted at %q, want %q at the same path", path, mount, tc.wantPath)
			}
		})
	}
}
