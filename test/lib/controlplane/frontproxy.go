package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// FrontProxyClientName is the common name of the front-proxy client
// certificate and the only name --requestheader-allowed-names admits.
const FrontProxyClientName = "front-proxy-client"

// frontProxyFiles are the request-header (front-proxy) credentials: the CA
// the API server publishes as requestheader-client-ca-file in
// kube-system/extension-apiserver-authentication, and the client
// certificate it presents to aggregated API servers and webhooks.
type frontProxyFiles struct{ ca, cert, key string }

// apiServerFlags are kube-apiserver's request-header flags with the header
// names kubeadm uses, which aggregated servers expect by default.
func (f frontProxyFiles) apiServerFlags() []string {
	return []string{
		"--requestheader-client-ca-file=" + f.ca,
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + f.cert,
		"--proxy-client-key-file=" + f.key,
	}
}

// writeFrontProxyCerts makes a CA and a client certificate signed by it in
// dir. An aggregated API server (KubeVirt's virt-api) reads the CA from
// extension-apiserver-authentication to verify the API server's proxied
// requests, and virt-api refuses to start without it. ECDSA P-256: made in
// about a millisecond, where an RSA key would add a noticeable share of
// every plane's start.
func writeFrontProxyCerts(dir string) (frontProxyFiles, error) {
	f := frontProxyFiles{
		ca:   filepath.Join(dir, "front-proxy-ca.crt"),
		cert: filepath.Join(dir, "front-proxy-client.crt"),
		key:  filepath.Join(dir, "front-proxy-client.key"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, fmt.Errorf("generate front-proxy CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vfnet-front-proxy-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("sign front-proxy CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, fmt.Errorf("generate front-proxy client key: %w", err)
	}
	clientTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: FrontProxyClientName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, clientTmpl, ca, &clientKey.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("sign front-proxy client certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return f, err
	}
	for _, w := range []struct {
		path, typ string
		der       []byte
	}{{f.ca, "CERTIFICATE", caDER}, {f.cert, "CERTIFICATE", clientDER}, {f.key, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return f, fmt.Errorf("write %s: %w", w.path, err)
		}
	}
	return f, nil
}
