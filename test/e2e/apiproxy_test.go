package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// apiProxy is a reverse proxy on loopback between one driver and the real
// API server: TLS on both sides, the driver's own token passed through (so
// RBAC and admission are the real ones). intercept sees each request first
// and answers it itself (an error, or no answer until the client gives up)
// by returning true; everything else passes.
type apiProxy struct {
	srv       *httptest.Server
	rp        *httputil.ReverseProxy
	intercept func(w http.ResponseWriter, r *http.Request) bool
}

func startAPIProxy(t *testing.T, plane *controlplane.Plane, intercept func(w http.ResponseWriter, r *http.Request) bool) *apiProxy {
	t.Helper()
	target, err := url.Parse(plane.URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(plane.AdminRESTConfig().TLSClientConfig.CAData) {
		t.Fatal("control plane CA data holds no certificate")
	}
	p := &apiProxy{intercept: intercept}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true},
		FlushInterval: -1, // watches stream
		// A client that hangs up (a canceled watch or list) is no error here.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
	}
	p.srv = httptest.NewUnstartedServer(p)
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(func() {
		// The driver's watches are open: no new connections, drop the open
		// ones, then wait for the handlers.
		p.srv.Listener.Close()
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

// endpoint is the proxy as the driver's kubeconfig names it.
func (p *apiProxy) endpoint() *flow.APIServer {
	return &flow.APIServer{URL: p.srv.URL, CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})}
}

func (p *apiProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.intercept(w, r) {
		return
	}
	p.rp.ServeHTTP(w, r)
}
