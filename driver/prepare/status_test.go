package prepare_test

import (
	"context"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// Another driver writes its status entry between our read and our write:
// the API server answers Conflict, and the retry must keep that entry.
func TestStatusMergeOnConflict(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	c := preparetest.Claim("ns", "a", "uid-a", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:00:42"}`))
	e.AddClaim(t, c)
	var calls atomic.Int32
	e.Kube.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" || calls.Add(1) != 1 {
			return false, nil, nil
		}
		// The rival update lands first (through the tracker directly).
		cur, err := e.Kube.Tracker().Get(resourceapi.SchemeGroupVersion.WithResource("resourceclaims"), "ns", "a")
		if err != nil {
			return true, nil, err
		}
		rival := cur.(*resourceapi.ResourceClaim).DeepCopy()
		rival.Status.Devices = append(rival.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: "other.example.com", Pool: "p", Device: "d"})
		if err := e.Kube.Tracker().Update(resourceapi.SchemeGroupVersion.WithResource("resourceclaims"), rival, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "a", nil)
	})
	s := e.NewState(t, nil)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	got, err := e.Kube.ResourceV1().ResourceClaims("ns").Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status.Devices
	if calls.Load() < 2 || len(st) != 2 || st[0].Driver != "other.example.com" || st[1].NetworkData == nil || st[1].NetworkData.HardwareAddress != "02:00:00:00:00:42" {
		t.Fatalf("after %d updates status.devices = %+v", calls.Load(), st)
	}
	cond := st[1].Conditions
	if len(cond) != 1 || cond[0].Type != "Ready" || cond[0].Status != metav1.ConditionTrue {
		t.Fatalf("conditions %+v", cond)
	}
}
