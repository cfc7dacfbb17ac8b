package flow

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// crd is a CustomResourceDefinition as the apiserver returns it: right
// after create its status holds "conditions": null (the field has no
// omitempty), the state `kubectl wait` fails on instead of waiting.
func crd(name string, conditions []any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": name},
		"status":     map[string]any{"conditions": conditions},
	}}
}

func crdClient(t *testing.T, reads *atomic.Int32, get func(name string, n int32) *unstructured.Unstructured) *dynamicfake.FakeDynamicClient {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "CustomResourceDefinitionList"})
	c.PrependReactor("get", "customresourcedefinitions", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, get(a.(k8stesting.GetAction).GetName(), reads.Add(1)), nil
	})
	return c
}

func TestWaitKubeVirtCRDsEstablishedWaitsThroughNullConditions(t *testing.T) {
	t.Parallel()
	var reads atomic.Int32
	established := []any{
		map[string]any{"type": "NamesAccepted", "status": "True"},
		map[string]any{"type": "Established", "status": "True"},
	}
	c := crdClient(t, &reads, func(name string, n int32) *unstructured.Unstructured {
		// The first reads see the CRD as just created, then names
		// accepted but not yet established.
		switch {
		case n <= 2:
			return crd(name, nil)
		case n == 3:
			return crd(name, []any{map[string]any{"type": "Established", "status": "False"}})
		}
		return crd(name, established)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitKubeVirtCRDsEstablished(ctx, c); err != nil {
		t.Fatalf("WaitKubeVirtCRDsEstablished: %v", err)
	}
	// Four reads for the first CRD, one for each of the other two.
	if got := reads.Load(); got != 6 {
		t.Errorf("CRD reads = %d, want 6", got)
	}
}

func TestWaitKubeVirtCRDsEstablishedNamesTheCRDThatNeverIs(t *testing.T) {
	t.Parallel()
	var reads atomic.Int32
	c := crdClient(t, &reads, func(name string, _ int32) *unstructured.Unstructured {
		return crd(name, nil)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := WaitKubeVirtCRDsEstablished(ctx, c)
	if err == nil || !strings.Contains(err.Error(), "virtualmachineinstances.kubevirt.io") {
		t.Fatalf("WaitKubeVirtCRDsEstablished = %v, want an error naming virtualmachineinstances.kubevirt.io", err)
	}
}
