// Command genoperator renders KubeVirt v1.9.0's virt-operator install
// manifest (what manifests/release/kubevirt-operator.yaml.in becomes after
// hack/build-manifests.sh) from KubeVirt's own generators, with the
// parameters the real-node tier needs, and optionally the KubeVirt CR and the
// install strategy virt-operator would derive from that CR.
//
// The objects and their order follow kubevirt-operator.yaml.in: Namespace,
// the KubeVirt CRD (resource-generator --type=kv), the kubevirt-cluster-critical
// PriorityClass, the kubevirt.io:operator ClusterRole written in the template,
// the operator RBAC (resource-generator --type=operator-rbac) and the
// virt-operator Deployment (manifest-templator's getOperatorDeploymentSpec).
//
// Deviations from the release manifest, each behind a flag:
//   - -operator-replicas (release: 2);
//   - -node: pins virt-operator with a kubernetes.io/hostname nodeSelector
//     and drops the required node-role.kubernetes.io/control-plane|master
//     affinity (placement.RequireControlPlanePreferNonWorker), which a node
//     without that label could never satisfy. Empty keeps the release
//     placement (then label the node node-role.kubernetes.io/control-plane="").
//   - -liveness-delay (release: 5 s): the first liveness probe of
//     virt-operator. Its start-up costs 3-5 CPU-seconds natively; on a
//     loaded two-core machine it was not serving after the release's 5 s
//     plus three failed probes, and the kubelet restarted it in a loop.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	virtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/install"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
	operatorutil "kubevirt.io/kubevirt/pkg/virt-operator/util"
	"kubevirt.io/kubevirt/tools/util"
)

type options struct {
	namespace, registry, tag, pullPolicy, verbosity string
	operatorReplicas                                int
	livenessDelay                                   int
	node                                            string

	// KubeVirt CR
	infraNode, handlerSelector, featureGates string
	virtTemplate, commonInstancetypes        bool

	out, crOut, strategyOut string
}

func main() {
	var o options
	flag.StringVar(&o.namespace, "namespace", "kubevirt", "install namespace (virt-operator and its components)")
	flag.StringVar(&o.registry, "registry", "quay.io/kubevirt", "image registry: images are <registry>/virt-<component>:<tag>")
	flag.StringVar(&o.tag, "tag", "v1.9.0", "image tag (also KUBEVIRT_VERSION)")
	flag.StringVar(&o.pullPolicy, "pull-policy", "IfNotPresent", "imagePullPolicy of virt-operator and (through the CR) its components")
	flag.StringVar(&o.verbosity, "verbosity", "2", "virt-operator -v")
	flag.IntVar(&o.operatorReplicas, "operator-replicas", 1, "virt-operator replicas (release manifest: 2)")
	flag.IntVar(&o.livenessDelay, "liveness-delay", 5, "seconds before virt-operator's first liveness probe (release manifest: 5)")
	flag.StringVar(&o.node, "node", "", "pin virt-operator to this node name (drops the control-plane affinity); empty keeps the release placement")
	flag.StringVar(&o.out, "o", "-", "operator manifest output file (- is stdout)")

	flag.StringVar(&o.crOut, "cr", "", "also write the KubeVirt CR to this file")
	flag.StringVar(&o.infraNode, "infra-node", "", "CR: spec.infra.nodePlacement pin for virt-api/virt-controller (and the install-strategy Job); default -node")
	flag.StringVar(&o.handlerSelector, "handler-node-selector", "vfnet.test/virt-handler=true",
		"CR: spec.workloads.nodePlacement.nodeSelector key=value for the virt-handler DaemonSet (empty: every node); the default matches no node, so the DaemonSet schedules nothing")
	flag.StringVar(&o.featureGates, "feature-gates", "NetworkDevicesWithDRA,ReservedOverheadMemlock", "CR: developerConfiguration.featureGates")
	flag.BoolVar(&o.virtTemplate, "virt-template", false,
		"CR: configuration.virtTemplateDeployment.enabled (the Template gate is Beta, so on by default in v1.9.0; its images and APIServices cannot be built here)")
	flag.BoolVar(&o.commonInstancetypes, "common-instancetypes", false, "CR: configuration.commonInstancetypesDeployment.enabled (119 cluster objects)")
	flag.StringVar(&o.strategyOut, "strategy", "", "also write the install strategy virt-operator derives from -cr's CR and its Deployment's env (needs -cr)")
	flag.Parse()
	if o.infraNode == "" {
		o.infraNode = o.node
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "genoperator:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	var buf bytes.Buffer
	deployment, err := writeOperator(&buf, o)
	if err != nil {
		return err
	}
	if err := writeOut(o.out, buf.Bytes()); err != nil {
		return err
	}
	if o.crOut == "" {
		if o.strategyOut != "" {
			return fmt.Errorf("-strategy needs -cr")
		}
		return nil
	}
	kv, err := newKubeVirtCR(o)
	if err != nil {
		return err
	}
	buf.Reset()
	if err := util.MarshallObject(kv, &buf); err != nil {
		return err
	}
	if err := writeOut(o.crOut, buf.Bytes()); err != nil {
		return err
	}
	if o.strategyOut == "" {
		return nil
	}
	strategy, id, err := renderStrategy(kv, deployment)
	if err != nil {
		return err
	}
	header := fmt.Sprintf("# Install strategy virt-operator v1.9.0 derives for this CR (deployment ID %s,\n"+
		"# if the API server stores the CR's string fields as written; monitor namespace none).\n", id)
	return writeOut(o.strategyOut, append([]byte(header), strategy...))
}

func writeOut(file string, data []byte) error {
	if file == "-" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(file, data, 0o644)
}

// writeOperator writes the objects of kubevirt-operator.yaml.in in order and
// returns the Deployment.
func writeOperator(w io.Writer, o options) (*appsv1.Deployment, error) {
	ns := &corev1.Namespace{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{
			Name: o.namespace,
			Labels: map[string]string{
				"kubevirt.io":                        "",
				"pod-security.kubernetes.io/enforce": "privileged",
			},
		},
	}
	crd, err := components.NewKubeVirtCrd()
	if err != nil {
		return nil, err
	}
	// Written by hand in kubevirt-operator.yaml.in.
	kubevirtsRole := &rbacv1.ClusterRole{
		TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "kubevirt.io:operator",
			Labels: map[string]string{
				"operator.kubevirt.io":                         "",
				"rbac.authorization.k8s.io/aggregate-to-admin": "true",
			},
		},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"kubevirt.io"},
			Resources: []string{"kubevirts"},
			Verbs:     []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"},
		}},
	}

	// As hack/build-manifests.sh calls manifest-templator: container prefix
	// = registry, tag = DockerTag = KUBEVIRT_VERSION, no per-image overrides.
	d := components.NewOperatorDeployment(o.namespace, o.registry, "", o.tag, o.verbosity, o.tag,
		"", "", "", "", "", "", "", "", "", "", "", "", "", "", corev1.PullPolicy(o.pullPolicy))
	replicas := int32(o.operatorReplicas)
	d.Spec.Replicas = &replicas
	for i := range d.Spec.Template.Spec.Containers {
		if p := d.Spec.Template.Spec.Containers[i].LivenessProbe; p != nil {
			p.InitialDelaySeconds = int32(o.livenessDelay)
		}
	}
	if o.node != "" {
		spec := &d.Spec.Template.Spec
		spec.NodeSelector[corev1.LabelHostname] = o.node
		if spec.Affinity != nil {
			spec.Affinity.NodeAffinity = nil
		}
	}

	objs := []any{ns, crd, components.NewKubeVirtPriorityClassCR(), kubevirtsRole}
	objs = append(objs, rbac.GetAllOperator(o.namespace)...)
	objs = append(objs, d)
	for _, obj := range objs {
		if err := util.MarshallObject(obj, w); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func splitKV(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return nil, fmt.Errorf("%q: want key=value", s)
	}
	return map[string]string{k: v}, nil
}

// newKubeVirtCR is the CR the tier applies: emulation, the DRA network gate,
// one replica of virt-api and virt-controller pinned to the infra node,
// virt-handler restricted by a node selector. The vfnet binding is not in
// it: the tier registers it as a user does, with
// manifests/kubevirt/binding-patch.yaml as a merge patch.
func newKubeVirtCR(o options) (*virtv1.KubeVirt, error) {
	one := uint8(1)
	kv := &virtv1.KubeVirt{
		TypeMeta:   metav1.TypeMeta{APIVersion: virtv1.GroupVersion.String(), Kind: "KubeVirt"},
		ObjectMeta: metav1.ObjectMeta{Namespace: o.namespace, Name: "kubevirt"},
		Spec: virtv1.KubeVirtSpec{
			ImagePullPolicy: corev1.PullPolicy(o.pullPolicy),
			Infra:           &virtv1.ComponentConfig{Replicas: &one},
			Configuration: virtv1.KubeVirtConfiguration{
				ImagePullPolicy:               corev1.PullPolicy(o.pullPolicy),
				VirtTemplateDeployment:        &virtv1.VirtTemplateDeployment{Enabled: &o.virtTemplate},
				CommonInstancetypesDeployment: &virtv1.CommonInstancetypesDeployment{Enabled: &o.commonInstancetypes},
				DeveloperConfiguration: &virtv1.DeveloperConfiguration{
					UseEmulation: true,
				},
			},
		},
	}
	if o.featureGates != "" {
		kv.Spec.Configuration.DeveloperConfiguration.FeatureGates = strings.Split(o.featureGates, ",")
	}
	if o.infraNode != "" {
		kv.Spec.Infra.NodePlacement = &virtv1.NodePlacement{
			NodeSelector: map[string]string{corev1.LabelHostname: o.infraNode},
		}
	}
	sel, err := splitKV(o.handlerSelector)
	if err != nil {
		return nil, fmt.Errorf("-handler-node-selector: %w", err)
	}
	if sel != nil {
		kv.Spec.Workloads = &virtv1.ComponentConfig{NodePlacement: &virtv1.NodePlacement{NodeSelector: sel}}
	}
	return kv, nil
}

// envOf is virt-operator's environment as its Deployment sets it.
type envOf map[string]string

func (e envOf) Getenv(k string) string   { return e[k] }
func (e envOf) Setenv(k, v string) error { e[k] = v; return nil }
func (e envOf) Unsetenv(k string) error  { delete(e, k); return nil }
func (e envOf) Environ() (out []string) {
	for k, v := range e {
		out = append(out, k+"="+v)
	}
	return out
}

// renderStrategy computes what the install-strategy Job
// (virt-operator --dump-install-strategy) would put into its ConfigMap.
func renderStrategy(kv *virtv1.KubeVirt, d *appsv1.Deployment) ([]byte, string, error) {
	env := envOf{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	config := operatorutil.GetTargetConfigFromKVWithEnvVarManager(kv, env)
	cm, err := install.NewInstallStrategyConfigMap(config, "", kv.Namespace)
	if err != nil {
		return nil, "", err
	}
	gz, err := base64.StdEncoding.DecodeString(cm.Data["manifests"])
	if err != nil {
		return nil, "", err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, "", err
	}
	data, err := io.ReadAll(zr)
	return data, config.GetDeploymentID(), err
}
