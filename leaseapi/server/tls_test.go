package server

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berthfleet/berth/test/pki"
)

// newTestCA is a certificate authority made up for one test.
func newTestCA(t *testing.T, name string) *pki.Authority {
	t.Helper()
	ca, err := pki.NewAuthority(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// clientCert issues, from ca, a client certificate with common name cn.
func clientCert(t *testing.T, ca *pki.Authority, cn string) tls.Certificate {
	t.Helper()
	pair, err := ca.ClientCert(cn)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// clientWith is the fixture's TLS client presenting certs.
func (f *fixture) clientWith(certs ...tls.Certificate) *http.Client {
	tr := f.http.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.Certificates = certs
	return &http.Client{Transport: tr}
}

func TestClientCertificates(t *testing.T) {
	ca := newTestCA(t, "berth test CA")
	f := newFixture(t, fixtureOptions{
		auth: NewAuthenticator(nil, true, []string{"admin"}),
		tls: func(s *httptest.Server) {
			s.TLS = &tls.Config{ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
		},
	})
	clusterA := f.clientWith(clientCert(t, ca, "cluster-a"))
	admin := f.clientWith(clientCert(t, ca, "admin"))
	anonymous := f.clientWith()
	if res := doWith(t, clusterA, f.http.URL, request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a", body: `{"fingerprint":"fp-a"}`}); res.code != http.StatusOK {
		t.Fatalf("register by certificate: %d %s", res.code, res.body)
	}

	acquire := func(holder string) request {
		return request{method: http.MethodPost, path: leasePath("ns", holder[len(holder)-1:], "acquire"),
			body: `{"holder":"` + holder + `","ttlSeconds":10}`}
	}
	cases := map[string]struct {
		client   *http.Client
		req      request
		wantCode int
	}{
		"common name as holder":         {client: clusterA, req: acquire("cluster-a"), wantCode: http.StatusOK},
		"sub-holder of the common name": {client: clusterA, req: acquire("cluster-a/x"), wantCode: http.StatusOK},
		"another holder":                {client: clusterA, req: acquire("other"), wantCode: http.StatusForbidden},
		"register another cluster": {
			client: clusterA, req: request{method: http.MethodPut, path: "/v1alpha1/clusters/other", body: `{"fingerprint":"f"}`}, wantCode: http.StatusForbidden,
		},
		"no certificate":        {client: anonymous, req: acquire("cluster-a"), wantCode: http.StatusUnauthorized},
		"no certificate, probe": {client: anonymous, req: request{method: http.MethodGet, path: "/readyz"}, wantCode: http.StatusOK},
		"bearer token without a token file": {
			client: clusterA, req: request{method: http.MethodGet, path: "/v1alpha1/leases", token: tokenA}, wantCode: http.StatusUnauthorized,
		},
		"admin subject by certificate": {
			client: admin, req: request{method: http.MethodPost, path: "/v1alpha1/clusters/cluster-a/uncordon"}, wantCode: http.StatusOK,
		},
		"non-admin uncordon": {
			client: clusterA, req: request{method: http.MethodPost, path: "/v1alpha1/clusters/cluster-a/uncordon"}, wantCode: http.StatusForbidden,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := doWith(t, tc.client, f.http.URL, tc.req)
			if res.code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", res.code, tc.wantCode, res.body)
			}
		})
	}

	// A certificate from another authority is not sent by a Go client (it is
	// not among the server's acceptable CAs), so the caller is anonymous; a
	// client that insists on sending it fails the handshake.
	strangerCert := clientCert(t, newTestCA(t, "someone else's CA"), "cluster-a")
	res := doWith(t, f.clientWith(strangerCert), f.http.URL, acquire("cluster-a"))
	if res.code != http.StatusUnauthorized {
		t.Fatalf("certificate of an unknown CA: %d %s, want 401", res.code, res.body)
	}
	insisting := f.clientWith()
	insisting.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &strangerCert, nil
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.http.URL+"/v1alpha1/leases", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := insisting.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("certificate of an unknown CA sent anyway: answered %d, want a failed handshake", res.StatusCode)
	}
}
