// Command genlauncherpod prints, as JSON, the virt-launcher pod KubeVirt
// v1.9.0's virt-controller code renders for a VMI (or the VMI of a VM) under
// the configuration of a KubeVirt CR (e.g. manifests/kubevirt/binding-patch.yaml),
// for harnesses that need a launcher pod shaped exactly like KubeVirt's:
//
//	cd test/kubevirt && go run ./cmd/genlauncherpod -kubevirt CR.yaml -vm VM.yaml [-uid UID] [-gates NetworkDevicesWithDRA,...] [-vmi-out FILE] [-virt-api-mutations] [-v110-sidecar-claims]
//
// -vmi-out also writes the VMI the pod was rendered for (JSON), e.g. for a
// launcher stand-in that converts it to a domain.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/launcherpod"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/manifestcheck"
)

func main() {
	kvFile := flag.String("kubevirt", "", "YAML file with the KubeVirt CR (required)")
	vmFile := flag.String("vm", "", "YAML file with one VirtualMachine or VirtualMachineInstance (required)")
	uid := flag.String("uid", "0b5e6a3c-0000-4000-8000-000000000001", "UID of the VMI (the pod's owner reference)")
	gates := flag.String("gates", strings.Join(manifestcheck.RequiredGates, ","), "feature gates to enable on top of the CR's")
	vmiOut := flag.String("vmi-out", "", "also write the VMI (JSON) to this file")
	mutate := flag.Bool("virt-api-mutations", false, "first apply virt-api's VMI create mutations (defaults, non-root runtime user 107), as a VMI virt-controller creates gets them")
	v110 := flag.Bool("v110-sidecar-claims", false, "give binding sidecars their networks' claims, as KubeVirt renders the pod from v1.10")
	flag.Parse()
	if err := run(*kvFile, *vmFile, *uid, *gates, *vmiOut, *mutate, *v110); err != nil {
		fmt.Fprintln(os.Stderr, "genlauncherpod:", err)
		os.Exit(1)
	}
}

func run(kvFile, vmFile, uid, gates, vmiOut string, mutate, v110 bool) error {
	if kvFile == "" || vmFile == "" {
		return fmt.Errorf("-kubevirt and -vm are required")
	}
	objs, err := manifestcheck.DecodeFiles(kvFile, vmFile)
	if err != nil {
		return err
	}
	if len(objs.KubeVirts) != 1 {
		return fmt.Errorf("want one KubeVirt object, found %d", len(objs.KubeVirts))
	}
	var extra []string
	if gates != "" {
		extra = strings.Split(gates, ",")
	}
	cfg, _ := manifestcheck.ClusterConfig(objs.KubeVirts[0].Obj, extra...)
	var vmi *v1.VirtualMachineInstance
	switch {
	case len(objs.VMs) == 1 && len(objs.VMIs) == 0:
		vmi = launcherpod.VMIFromVM(objs.VMs[0].Obj, uid)
	case len(objs.VMIs) == 1 && len(objs.VMs) == 0:
		vmi = objs.VMIs[0].Obj
		if vmi.UID == "" {
			vmi.UID = types.UID(uid)
		}
	default:
		return fmt.Errorf("want exactly one VirtualMachine or VirtualMachineInstance, found %d and %d", len(objs.VMs), len(objs.VMIs))
	}
	if mutate {
		if err := launcherpod.MutateAsVirtAPI(vmi, cfg); err != nil {
			return err
		}
	}
	if vmiOut != "" {
		data, err := json.Marshal(vmi)
		if err != nil {
			return err
		}
		if err := os.WriteFile(vmiOut, data, 0o644); err != nil {
			return err
		}
	}
	pod, err := launcherpod.Render(vmi, cfg)
	if err != nil {
		return err
	}
	if v110 {
		if err := launcherpod.AddBindingSidecarClaims(pod, vmi); err != nil {
			return err
		}
	}
	return emit(pod, nil)
}

func emit(pod any, err error) error {
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(pod)
}
