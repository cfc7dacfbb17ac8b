// Package helm renders, lints and compares the Helm chart in
// deployments/helm/vfnet with the Helm v4 Go SDK and the kustomize tree in
// manifests/ with kustomize's own API, so a test can show that both install
// paths create the same objects (manifests/ is the source of truth; the
// chart must follow it). It is a module of its own: the Helm SDK's
// dependency tree stays out of the product module.
package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version the chart is rendered and linted
// for: the one the project's tiers run.
const KubeVersion = "v1.37.2"

// ChartDir is the chart's path inside the repository.
const ChartDir = "deployments/helm/vfnet"

// HelmLabels are the label keys the chart adds to every object's metadata
// (Helm's conventions; manifests/ has none of them).
func HelmLabels() []string {
	return []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}
}

// Rendered is what `helm install` would create, and the notes it prints.
type Rendered struct {
	Objects []*unstructured.Unstructured
	Notes   string
}

// Render renders the chart in chartDir as release name in namespace with
// vals (merged over the chart's values.yaml, as `helm install -f` does),
// client-side like `helm template`.
func Render(chartDir, name, namespace string, vals map[string]any) (*Rendered, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = name
	install.Namespace = namespace
	install.KubeVersion = kv
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", chartDir, err)
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("render chart %s: a release of type %T", chartDir, rel)
	}
	objs, err := ParseObjects([]byte(r.Manifest))
	if err != nil {
		return nil, fmt.Errorf("rendered chart %s: %w", chartDir, err)
	}
	notes := ""
	if r.Info != nil {
		notes = r.Info.Notes
	}
	return &Rendered{Objects: objs, Notes: notes}, nil
}

// Lint runs Helm's chart linter (as `helm lint --strict`) with vals; any
// message of warning severity or worse is an error. Info messages (such
// as "icon is recommended") are returned apart.
func Lint(chartDir, namespace string, vals map[string]any) (infos []string, err error) {
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	l := action.NewLint()
	l.Strict = true
	l.Namespace = namespace
	l.KubeVersion = kv
	res := l.Run([]string{chartDir}, vals)
	var errs []error
	errs = append(errs, res.Errors...)
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			errs = append(errs, fmt.Errorf("%s", m.Error()))
		} else {
			infos = append(infos, m.Error())
		}
	}
	if res.TotalChartsLinted != 1 {
		errs = append(errs, fmt.Errorf("linted %d charts, want 1", res.TotalChartsLinted))
	}
	return infos, errors.Join(errs...)
}

// Kustomize builds the kustomization in dir with kustomize's API, as
// `kubectl kustomize dir` does.
func Kustomize(dir string) ([]*unstructured.Unstructured, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	b, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	objs, err := ParseObjects(b)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return objs, nil
}

// KustomizeWith builds a kustomization that lists base under resources and
// components under components (all directories), written to a temporary
// directory in tmp.
func KustomizeWith(tmp, base string, components ...string) ([]*unstructured.Unstructured, error) {
	dir, err := os.MkdirTemp(tmp, "kustomization-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
	}
	// kustomize wants paths relative to the kustomization.
	rel := func(p string) (string, error) { return filepath.Rel(dir, p) }
	b, err := rel(base)
	if err != nil {
		return nil, err
	}
	k["resources"] = []string{b}
	var cs []string
	for _, c := range components {
		r, err := rel(c)
		if err != nil {
			return nil, err
		}
		cs = append(cs, r)
	}
	if len(cs) > 0 {
		k["components"] = cs
	}
	out, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), out, 0o644); err != nil {
		return nil, err
	}
	return Kustomize(dir)
}

// ParseObjects splits a multi-document YAML stream into objects, skipping
// empty documents.
func ParseObjects(b []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("document %d has no kind or name: %v", i, m)
		}
		objs = append(objs, u)
	}
}

// Key names an object: Kind namespace/name (or Kind name when cluster-scoped).
func Key(u *unstructured.Unstructured) string {
	if ns := u.GetNamespace(); ns != "" {
		return u.GetKind() + " " + ns + "/" + u.GetName()
	}
	return u.GetKind() + " " + u.GetName()
}

// ByKey indexes objects by Key; a key twice is an error.
func ByKey(objs []*unstructured.Unstructured) (map[string]*unstructured.Unstructured, error) {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		k := Key(o)
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%s twice", k)
		}
		m[k] = o
	}
	return m, nil
}

// StripLabels removes the label keys from every object's metadata (not
// from pod templates or selectors), dropping an empty labels map.
func StripLabels(objs []*unstructured.Unstructured, keys ...string) {
	for _, o := range objs {
		l := o.GetLabels()
		for _, k := range keys {
			delete(l, k)
		}
		if len(l) == 0 {
			unstructured.RemoveNestedField(o.Object, "metadata", "labels")
		} else {
			o.SetLabels(l)
		}
	}
}

// ParseYAMLData replaces, in every ConfigMap, each data value whose key
// ends in .yaml or .yml with the YAML it holds, so that files compare by
// content, not by comments or key order.
func ParseYAMLData(objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetAPIVersion() != "v1" {
			continue
		}
		data, _, err := unstructured.NestedMap(o.Object, "data")
		if err != nil {
			return fmt.Errorf("%s: %w", Key(o), err)
		}
		for k, v := range data {
			s, ok := v.(string)
			if !ok || !(strings.HasSuffix(k, ".yaml") || strings.HasSuffix(k, ".yml")) {
				continue
			}
			var parsed any
			if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
				return fmt.Errorf("%s: data[%s]: %w", Key(o), k, err)
			}
			data[k] = parsed
		}
		if data != nil {
			o.Object["data"] = data
		}
	}
	return nil
}

// Diff compares two sets of objects and describes every difference, one
// line each, naming the object and the field:
//
//	DaemonSet vfnet-system/vfnet-driver: spec.template.spec.containers[name=driver].args[5]: want "--v=2", got missing
//
// Objects are matched by Key; lists of maps that all have a "name" are
// matched by name, other lists by index. An empty result means equal.
func Diff(want, got []*unstructured.Unstructured) ([]string, error) {
	w, err := ByKey(want)
	if err != nil {
		return nil, fmt.Errorf("want: %w", err)
	}
	g, err := ByKey(got)
	if err != nil {
		return nil, fmt.Errorf("got: %w", err)
	}
	var out []string
	for _, k := range sortedKeys(w) {
		if _, ok := g[k]; !ok {
			out = append(out, k+": missing")
			continue
		}
		for _, d := range diffValue("", w[k].Object, g[k].Object) {
			out = append(out, k+": "+d)
		}
	}
	for _, k := range sortedKeys(g) {
		if _, ok := w[k]; !ok {
			out = append(out, k+": unexpected")
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func join(path, field string) string {
	if path == "" || strings.HasPrefix(field, "[") {
		return path + field
	}
	return path + "." + field
}

func show(v any) string {
	if v == nil {
		return "null"
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	s := strings.TrimSpace(string(b))
	if strings.Contains(s, "\n") {
		return "\n    " + strings.ReplaceAll(s, "\n", "\n    ")
	}
	return s
}

// diffValue compares two decoded YAML values. Numbers compare by value
// (the YAML decoder yields int64 or float64 depending on the source text).
func diffValue(path string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: want %s, got %s", path, show(want), show(got))}
		}
		var out []string
		keys := map[string]bool{}
		for k := range w {
			keys[k] = true
		}
		for k := range g {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			wv, wok := w[k]
			gv, gok := g[k]
			switch {
			case !gok:
				out = append(out, fmt.Sprintf("%s: want %s, got missing", join(path, k), show(wv)))
			case !wok:
				out = append(out, fmt.Sprintf("%s: want missing, got %s", join(path, k), show(gv)))
			default:
				out = append(out, diffValue(join(path, k), wv, gv)...)
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: want %s, got %s", path, show(want), show(got))}
		}
		if wn, gn, ok := namedItems(w, g); ok {
			return diffValue(path, wn, gn)
		}
		var out []string
		for i := 0; i < max(len(w), len(g)); i++ {
			p := fmt.Sprintf("%s[%d]", path, i)
			switch {
			case i >= len(g):
				out = append(out, fmt.Sprintf("%s: want %s, got missing", p, show(w[i])))
			case i >= len(w):
				out = append(out, fmt.Sprintf("%s: want missing, got %s", p, show(g[i])))
			default:
				out = append(out, diffValue(p, w[i], g[i])...)
			}
		}
		return out
	default:
		if wf, ok := number(want); ok {
			if gf, ok := number(got); ok && wf == gf {
				return nil
			}
		} else if want == got {
			return nil
		}
		return []string{fmt.Sprintf("%s: want %s, got %s", path, show(want), show(got))}
	}
}

// namedItems turns two lists whose items are all maps with a distinct
// string "name" into maps keyed "[name=<name>]", so a diff says which
// container or volume differs rather than an index.
func namedItems(w, g []any) (map[string]any, map[string]any, bool) {
	index := func(l []any) (map[string]any, bool) {
		m := map[string]any{}
		for _, it := range l {
			im, ok := it.(map[string]any)
			if !ok {
				return nil, false
			}
			n, ok := im["name"].(string)
			if !ok {
				return nil, false
			}
			k := "[name=" + n + "]"
			if _, dup := m[k]; dup {
				return nil, false
			}
			m[k] = it
		}
		return m, true
	}
	if len(w) == 0 && len(g) == 0 {
		return nil, nil, false
	}
	wm, ok1 := index(w)
	gm, ok2 := index(g)
	return wm, gm, ok1 && ok2
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}
