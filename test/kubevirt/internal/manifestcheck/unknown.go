package manifestcheck

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// unknownFields lists every key in the JSON document that no field of the
// Go type t accepts, as dotted paths.
//
// encoding/json's DisallowUnknownFields alone is not enough for KubeVirt's
// types: VirtualMachineInstanceSpec, PodNetwork and DHCPOptions have their
// own UnmarshalJSON that decodes an alias with a plain json.Unmarshal, which
// silently drops unknown keys anywhere below a VMI spec. This walk follows
// the struct tags instead. Types from outside kubevirt.io/api that decode
// themselves (metav1.Time, resource.Quantity, IntOrString, RawExtension)
// are leaves.
func unknownFields(doc any, t reflect.Type) []string {
	var out []string
	walk(doc, t, "", &out)
	sort.Strings(out)
	return out
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func walk(v any, t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) && !strings.HasPrefix(t.PkgPath(), "kubevirt.io/api/") {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return // a type error; the typed decode reports it
		}
		fields := jsonFields(t)
		for k, val := range obj {
			ft, ok := fields[k]
			if !ok {
				*out = append(*out, join(path, k))
				continue
			}
			walk(val, ft, join(path, k), out)
		}
	case reflect.Slice, reflect.Array:
		if arr, ok := v.([]any); ok {
			for i, e := range arr {
				walk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
			}
		}
	case reflect.Map:
		if obj, ok := v.(map[string]any); ok {
			for k, e := range obj {
				walk(e, t.Elem(), join(path, k), out)
			}
		}
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// jsonFields maps JSON names to field types, flattening embedded structs
// the way encoding/json does (inline when untagged or tagged ",inline").
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" && tag == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					out[k] = v
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
