package prepare_test

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

// TestPrepareUnprepareLogged: at the default verbosity (0) each successful
// prepare and unprepare is one line naming the claim, the VF and the
// duration; an unprepare of a claim this driver never prepared is not.
func TestPrepareUnprepareLogged(t *testing.T) {
	t.Parallel()
	var buf syncbuf.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(0))))
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	pod := e.AddVM(t, "ns", "vm1", "vf-claim", "02:00:00:00:00:01")
	c := preparetest.ReserveFor(preparetest.Claim("ns", "vm1-vf", "uid-1", []string{vf1}), pod, "vf-claim")
	e.AddClaim(t, c)
	s := e.NewState(t, nil)

	res, err := s.Prepare(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res[c.UID].Err)
	}
	obj := []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}}
	for i := 0; i < 2; i++ { // the second is a no-op
		ures, err := s.Unprepare(ctx, obj)
		if err != nil || ures[c.UID] != nil {
			t.Fatal(err, ures[c.UID])
		}
	}
	var prepared, unprepared []string
	for _, l := range strings.Split(buf.String(), "\n") {
		switch {
		case strings.Contains(l, `"Prepared claim"`):
			prepared = append(prepared, l)
		case strings.Contains(l, `"Unprepared claim"`):
			unprepared = append(unprepared, l)
		}
	}
	if len(prepared) != 1 || len(unprepared) != 1 {
		t.Fatalf("want one Prepared and one Unprepared line, got %q and %q; log:\n%s", prepared, unprepared, buf.String())
	}
	for _, l := range append(prepared, unprepared...) {
		for _, want := range []string{`claim="ns/vm1-vf"`, `vfs=["` + vf1 + "=" + vf1BDF + `"]`, "duration="} {
			if !strings.Contains(l, want) {
				t.Errorf("line %q lacks %s", l, want)
			}
		}
	}
}
