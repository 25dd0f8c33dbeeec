package certs

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var (
	t0    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	day   = 24 * time.Hour
	year  = 365 * day
	names = DNSNames("berth-agent-webhook", "berth-system")
)

// authority is a CA made by newCA at made.
type authority struct {
	cert   *x509.Certificate
	key    crypto.Signer
	keyPEM []byte
}

func mkCA(t *testing.T, made time.Time, validity time.Duration) authority {
	t.Helper()
	cert, key, keyPEM, err := newCA(made, validity, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authority{cert, key, keyPEM}
}

func (a authority) certPEM() []byte { return EncodeBundle([]*x509.Certificate{a.cert}) }

// serve issues a serving certificate made at made.
func (a authority) serve(t *testing.T, made time.Time, validity time.Duration, names []string) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := newServing(made, validity, names, a.cert, a.key, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// secret is the data of a Secret with ca's certificate and key, a serving pair, and
// older CAs after ca in the bundle.
func secret(ca authority, certPEM, keyPEM []byte, older ...authority) map[string][]byte {
	bundle := []*x509.Certificate{ca.cert}
	for _, o := range older {
		bundle = append(bundle, o.cert)
	}
	return map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM, KeyCABundle: EncodeBundle(bundle), KeyCAKey: ca.keyPEM}
}

func with(data map[string][]byte, key string, value []byte) map[string][]byte {
	data = maps.Clone(data)
	if value == nil {
		delete(data, key)
	} else {
		data[key] = value
	}
	return data
}

// clientOnlyCert is a certificate from ca for names that may not serve.
func clientOnlyCert(t *testing.T, ca authority, made time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, keyPEM, err := newKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := template(made, made.Add(year), names[0], rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.DNSNames = names
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

func TestDecide(t *testing.T) {
	ca := mkCA(t, t0, DefaultCAValidity)
	other := mkCA(t, t0, DefaultCAValidity)
	crt, key := ca.serve(t, t0, DefaultServingValidity, names)
	otherCrt, otherKey := other.serve(t, t0, DefaultServingValidity, names)
	wrongCrt, wrongKey := ca.serve(t, t0, DefaultServingValidity, DNSNames("other", "berth-system"))
	fewCrt, fewKey := ca.serve(t, t0, DefaultServingValidity, names[2:])
	clientCrt, clientKey := clientOnlyCert(t, ca, t0)
	good := secret(ca, crt, key)
	// A CA replaced a day after t0: the old one is kept for the overlap.
	newer := mkCA(t, t0.Add(day), DefaultCAValidity)
	newerCrt, newerKey := newer.serve(t, t0.Add(day), DefaultServingValidity, names)
	rotated := secret(newer, newerCrt, newerKey, ca)
	expiredCA := mkCA(t, t0.Add(-2*year), year)

	keep := Decision{}
	newCA := func(why Reason) Decision { return Decision{NewCA: why, NewServing: ReasonNewCA} }
	cases := map[string]struct {
		data map[string][]byte
		now  time.Time
		want Decision
	}{
		"nothing":                     {data: nil, now: t0, want: newCA(ReasonMissing)},
		"usable":                      {data: good, now: t0.Add(30 * day), want: keep},
		"usable at once (backdated)":  {data: good, now: t0, want: keep},
		"no CA key":                   {data: with(good, KeyCAKey, nil), now: t0, want: newCA(ReasonMissing)},
		"no CA certificate":           {data: with(good, KeyCABundle, nil), now: t0, want: newCA(ReasonMissing)},
		"garbage CA certificate":      {data: with(good, KeyCABundle, []byte("garbage")), now: t0, want: newCA(ReasonUnparsable)},
		"garbage PEM CA certificate":  {data: with(good, KeyCABundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")})), now: t0, want: newCA(ReasonUnparsable)},
		"garbage CA key":              {data: with(good, KeyCAKey, []byte("garbage")), now: t0, want: newCA(ReasonUnparsable)},
		"CA key of another CA":        {data: with(good, KeyCAKey, other.keyPEM), now: t0, want: newCA(ReasonKeyMismatch)},
		"serving certificate as CA":   {data: with(with(good, KeyCABundle, crt), KeyCAKey, key), now: t0, want: newCA(ReasonNotCA)},
		"CA not yet valid":            {data: good, now: t0.Add(-2 * time.Hour), want: newCA(ReasonNotYetValid)},
		"CA expired":                  {data: good, now: t0.Add(11 * year), want: newCA(ReasonExpired)},
		"CA near expiry":              {data: good, now: t0.Add(7 * year), want: newCA(ReasonExpiring)},
		"CA just before renewal":      {data: issued(t, ca, t0.Add(6*year)), now: t0.Add(6 * year), want: keep},
		"expired CA, valid-looking":   {data: issued(t, expiredCA, t0.Add(-2*year)), now: t0, want: newCA(ReasonExpired)},
		"no serving certificate":      {data: with(good, KeyCert, nil), now: t0, want: Decision{NewServing: ReasonMissing}},
		"no serving key":              {data: with(good, KeyKey, nil), now: t0, want: Decision{NewServing: ReasonMissing}},
		"garbage serving certificate": {data: with(good, KeyCert, []byte("garbage")), now: t0, want: Decision{NewServing: ReasonUnparsable}},
		"garbage serving key":         {data: with(good, KeyKey, []byte("-----BEGIN PRIVATE KEY-----\nZ2FyYmFnZQ==\n-----END PRIVATE KEY-----\n")), now: t0, want: Decision{NewServing: ReasonUnparsable}},
		"serving key of another pair": {data: with(good, KeyKey, otherKey), now: t0, want: Decision{NewServing: ReasonKeyMismatch}},
		"serving from another CA":     {data: with(with(good, KeyCert, otherCrt), KeyKey, otherKey), now: t0, want: Decision{NewServing: ReasonWrongCA}},
		"serving for other names":     {data: with(with(good, KeyCert, wrongCrt), KeyKey, wrongKey), now: t0, want: Decision{NewServing: ReasonWrongNames}},
		"serving for some names":      {data: with(with(good, KeyCert, fewCrt), KeyKey, fewKey), now: t0, want: Decision{NewServing: ReasonWrongNames}},
		"client certificate":          {data: with(with(good, KeyCert, clientCrt), KeyKey, clientKey), now: t0, want: Decision{NewServing: ReasonNotServing}},
		"serving not yet valid":       {data: issued(t, ca, t0.Add(year)), now: t0.Add(30 * day), want: Decision{NewServing: ReasonNotYetValid}},
		"serving near expiry":         {data: good, now: t0.Add(250 * day), want: Decision{NewServing: ReasonExpiring}},
		"serving just before renewal": {data: good, now: t0.Add(240 * day), want: keep},
		"serving expired":             {data: good, now: t0.Add(400 * day), want: Decision{NewServing: ReasonExpired}},
		"old CA within the overlap":   {data: rotated, now: t0.Add(day + 12*time.Hour), want: keep},
		"old CA after the overlap":    {data: rotated, now: t0.Add(2*day + time.Minute), want: Decision{StaleBundle: true}},
		"old expired CA":              {data: secret(ca, crt, key, expiredCA), now: t0, want: Decision{StaleBundle: true}},
		"garbage after the CA":        {data: with(good, KeyCABundle, append(ca.certPEM(), "garbage"...)), now: t0, want: Decision{StaleBundle: true}},
		"CA twice":                    {data: with(good, KeyCABundle, append(ca.certPEM(), ca.certPEM()...)), now: t0, want: Decision{StaleBundle: true}},
		"serving near expiry, stale bundle": {
			data: rotated, now: t0.Add(day + 250*day), want: Decision{NewServing: ReasonExpiring, StaleBundle: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Decide(tc.now, tc.data, names, Policy{})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
			if got.Changes() != (tc.want != Decision{}) {
				t.Errorf("Changes() = %v", got.Changes())
			}
			// Whatever the decision, carrying it out leaves a Secret that is kept.
			next, err := Next(tc.now, tc.data, got, names, Policy{}, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			if again := Decide(tc.now, next, names, Policy{}); again.Changes() {
				t.Errorf("after Next, Decide = %+v, want no changes", again)
			}
		})
	}
}

// issued is the data of a Secret with ca and a serving certificate it issued at made.
func issued(t *testing.T, ca authority, made time.Time) map[string][]byte {
	t.Helper()
	crt, key := ca.serve(t, made, DefaultServingValidity, names)
	return secret(ca, crt, key)
}

func TestBundle(t *testing.T) {
	old := mkCA(t, t0.Add(-year), DefaultCAValidity)
	older := mkCA(t, t0.Add(-2*year), DefaultCAValidity)
	shortLived := mkCA(t, t0.Add(-year), year+day)
	current := mkCA(t, t0, DefaultCAValidity)
	leafPEM, _ := current.serve(t, t0, DefaultServingValidity, names)
	leaf, err := parseCert(leafPEM)
	if err != nil {
		t.Fatal(err)
	}
	label := map[*x509.Certificate]string{old.cert: "old", older.cert: "older", shortLived.cert: "shortLived", current.cert: "current", leaf: "leaf"}
	cases := map[string]struct {
		now      time.Time
		previous [][]*x509.Certificate
		want     []string
	}{
		"only the current CA":         {now: t0, want: []string{"current"}},
		"old CAs within the overlap":  {now: t0.Add(12 * time.Hour), previous: [][]*x509.Certificate{{old.cert}, {older.cert, old.cert}}, want: []string{"current", "old", "older"}},
		"the current CA is not added": {now: t0, previous: [][]*x509.Certificate{{current.cert, old.cert}}, want: []string{"current", "old"}},
		"the overlap ended": {
			now: t0.Add(DefaultOverlap + time.Minute), previous: [][]*x509.Certificate{{old.cert}}, want: []string{"current"},
		},
		"an old CA expired within the overlap": {
			now: t0.Add(2 * day), previous: [][]*x509.Certificate{{shortLived.cert, old.cert}}, want: []string{"current"},
		},
		"just before the overlap ends": {
			now: t0.Add(DefaultOverlap - time.Minute), previous: [][]*x509.Certificate{{shortLived.cert, old.cert}}, want: []string{"current", "shortLived", "old"},
		},
		"a leaf is no CA": {now: t0, previous: [][]*x509.Certificate{{leaf, old.cert}}, want: []string{"current", "old"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, c := range Bundle(tc.now, current.cert, DefaultOverlap, tc.previous...) {
				got = append(got, label[c])
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Bundle (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTrustBundle(t *testing.T) {
	old := mkCA(t, t0.Add(-year), DefaultCAValidity)
	cmPEM := mkCA(t, t0.Add(-year), DefaultCAValidity).certPEM() // cert-manager's, before the agent took over
	current := mkCA(t, t0, DefaultCAValidity)
	secretBundle := EncodeBundle([]*x509.Certificate{current.cert, old.cert})
	cases := map[string]struct {
		now          time.Time
		secretBundle []byte
		existing     [][]byte
		want         []byte
	}{
		"no configuration had a CA": {now: t0, secretBundle: secretBundle, existing: [][]byte{nil, nil}, want: secretBundle},
		"the configurations keep a CA the Secret no longer has": {
			now: t0, secretBundle: current.certPEM(), existing: [][]byte{old.certPEM(), old.certPEM(), []byte("garbage")},
			want: secretBundle,
		},
		"cert-manager's CA is trusted for the overlap": {
			now: t0, secretBundle: secretBundle, existing: [][]byte{cmPEM},
			want: append(append([]byte{}, secretBundle...), cmPEM...),
		},
		"after the overlap only the current CA": {
			now: t0.Add(2 * DefaultOverlap), secretBundle: secretBundle, existing: [][]byte{secretBundle, cmPEM}, want: current.certPEM(),
		},
		"no CA in the Secret": {now: t0, secretBundle: []byte("garbage"), existing: [][]byte{cmPEM}, want: nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := TrustBundle(tc.now, tc.secretBundle, tc.existing, Policy{})
			if diff := cmp.Diff(string(tc.want), string(got)); diff != "" {
				t.Errorf("TrustBundle (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNext checks what Next keeps and makes, beyond TestDecide's check that its result
// is always kept.
func TestNext(t *testing.T) {
	ca := mkCA(t, t0, DefaultCAValidity)
	good := issued(t, ca, t0)
	p := Policy{}
	t.Run("a new serving certificate from the CA kept", func(t *testing.T) {
		now := t0.Add(250 * day)
		next, err := Next(now, good, Decide(now, good, names, p), names, p, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if !bytesEqual(next, good, KeyCABundle, KeyCAKey) || bytesEqual(next, good, KeyCert) || bytesEqual(next, good, KeyKey) {
			t.Error("want the CA kept and a new serving pair")
		}
		cert, err := parseCert(next[KeyCert])
		if err != nil {
			t.Fatal(err)
		}
		if got, want := cert.NotAfter, now.Add(DefaultServingValidity).Truncate(time.Second); !got.Equal(want) {
			t.Errorf("NotAfter %v, want %v", got, want)
		}
		if diff := cmp.Diff(names, cert.DNSNames); diff != "" {
			t.Errorf("DNS names (-want +got):\n%s", diff)
		}
	})
	t.Run("a new CA keeps the old one trusted", func(t *testing.T) {
		now := t0.Add(7 * year)
		next, err := Next(now, good, Decide(now, good, names, p), names, p, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		bundle := ParseBundle(next[KeyCABundle])
		if len(bundle) != 2 || bundle[0].Equal(ca.cert) || !bundle[1].Equal(ca.cert) {
			t.Fatalf("bundle of %d, want the new CA then the old", len(bundle))
		}
		if bytesEqual(next, good, KeyCAKey) {
			t.Error("the CA key was kept")
		}
		later := now.Add(DefaultOverlap + time.Hour)
		d := Decide(later, next, names, p)
		if diff := cmp.Diff(Decision{StaleBundle: true}, d); diff != "" {
			t.Fatalf("after the overlap (-want +got):\n%s", diff)
		}
		pruned, err := Next(later, next, d, names, p, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if got := ParseBundle(pruned[KeyCABundle]); len(got) != 1 || !got[0].Equal(bundle[0]) {
			t.Errorf("pruned bundle of %d, want the new CA alone", len(got))
		}
		if !bytesEqual(pruned, next, KeyCert, KeyKey, KeyCAKey) {
			t.Error("pruning the bundle changed the certificates")
		}
	})
	t.Run("a serving certificate never outlives its CA", func(t *testing.T) {
		short := Policy{CAValidity: 400 * day}
		data, err := Next(t0, nil, Decide(t0, nil, names, short), names, short, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		caCert, _ := parseCert(data[KeyCABundle])
		cert, _ := parseCert(data[KeyCert])
		now := t0.Add(100 * day)
		data, err = Next(now, data, Decision{NewServing: ReasonExpiring}, names, short, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		renewed, _ := parseCert(data[KeyCert])
		if cert.NotAfter.After(caCert.NotAfter) || !renewed.NotAfter.Equal(caCert.NotAfter) {
			t.Errorf("serving NotAfter %v then %v, CA NotAfter %v", cert.NotAfter, renewed.NotAfter, caCert.NotAfter)
		}
	})
}

func bytesEqual(a, b map[string][]byte, keys ...string) bool {
	for _, k := range keys {
		if string(a[k]) != string(b[k]) {
			return false
		}
	}
	return true
}

func TestWriteFiles(t *testing.T) {
	dir := t.TempDir() + "/certs"
	data := map[string][]byte{KeyCert: []byte("crt"), KeyKey: []byte("key"), KeyCABundle: []byte("ca"), KeyCAKey: []byte("ca key")}
	steps := []struct {
		name        string
		data        map[string][]byte
		wantWritten []string
	}{
		{"into a new folder", data, []string{KeyCABundle, KeyKey, KeyCert}},
		{"unchanged", data, nil},
		{"a new pair", with(with(data, KeyCert, []byte("crt2")), KeyKey, []byte("key2")), []string{KeyKey, KeyCert}},
	}
	for _, s := range steps {
		written, err := writeFiles(dir, s.data)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(s.wantWritten, written); diff != "" {
			t.Errorf("%s: written (-want +got):\n%s", s.name, diff)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	if diff := cmp.Diff([]string{KeyCABundle, KeyCert, KeyKey}, files); diff != "" {
		t.Errorf("files (no CA key, no temporary files) (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(dir + "/" + KeyKey); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("tls.key: %v, mode %v, want 0600", err, fi.Mode())
	}
	if got, _ := os.ReadFile(dir + "/" + KeyCert); string(got) != "crt2" {
		t.Errorf("tls.crt = %q", got)
	}
}
