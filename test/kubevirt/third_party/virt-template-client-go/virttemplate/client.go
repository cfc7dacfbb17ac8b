// Package virttemplate is a minimal stand-in for
// kubevirt.io/virt-template-client-go/virttemplate: a clientset with a plain
// REST client for the template group, which is all pkg/controller asks for.
package virttemplate

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// TemplateV1beta1Interface exposes the REST client of template.kubevirt.io/v1beta1.
type TemplateV1beta1Interface interface {
	RESTClient() rest.Interface
}

// Interface is the clientset.
type Interface interface {
	TemplateV1beta1() TemplateV1beta1Interface
}

type clientset struct{ v1beta1 *templateV1beta1 }

type templateV1beta1 struct{ rc rest.Interface }

func (c *clientset) TemplateV1beta1() TemplateV1beta1Interface { return c.v1beta1 }

func (c *templateV1beta1) RESTClient() rest.Interface { return c.rc }

// NewForConfig builds a REST client for template.kubevirt.io/v1beta1.
func NewForConfig(c *rest.Config) (Interface, error) {
	cfg := rest.CopyConfig(c)
	cfg.GroupVersion = &schema.GroupVersion{Group: "template.kubevirt.io", Version: "v1beta1"}
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.WithoutConversionCodecFactory{CodecFactory: scheme.Codecs}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("virt-template client for %s: %w", cfg.Host, err)
	}
	return &clientset{v1beta1: &templateV1beta1{rc: rc}}, nil
}
