package controlplane

import (
	"bytes"
	"testing"

	certutil "k8s.io/client-go/util/cert"
)

// TestCompleteChain: what a reader can see while the API server writes its
// self-signed chain (an empty file, then leaf and CA in one write that may be
// read part way) is refused until both certificates are there.
func TestCompleteChain(t *testing.T) {
	t.Parallel()
	chain, _, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The file holds the leaf, then the CA that signed it.
	end := bytes.Index(chain, []byte("-----END CERTIFICATE-----\n"))
	if end < 0 {
		t.Fatalf("generated chain has no PEM end marker:\n%s", chain)
	}
	leafOnly := chain[:end+len("-----END CERTIFICATE-----\n")]
	for name, data := range map[string][]byte{
		"empty":      nil,
		"half leaf":  chain[:end/2],
		"leaf only":  leafOnly,
		"half of CA": chain[:len(leafOnly)+(len(chain)-len(leafOnly))/2],
	} {
		if err := completeChain(data); err == nil {
			t.Errorf("%s: completeChain accepted an incomplete chain", name)
		}
	}
	if err := completeChain(chain); err != nil {
		t.Errorf("whole chain refused: %v", err)
	}
}
