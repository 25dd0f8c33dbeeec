package leaseapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// checkDecode decodes body into a value from newBody and checks what
// FuzzDecode promises.
func checkDecode(t *testing.T, body []byte, newBody func() any) {
	t.Helper()
	v := newBody()
	err := Decode(bytes.NewReader(body), v)
	if err != nil {
		var fieldErr *FieldError
		switch {
		case errors.Is(err, ErrBodyTooLarge):
			if len(body) <= MaxBodyBytes {
				t.Fatalf("body of %d bytes refused as too large", len(body))
			}
		case errors.As(err, &fieldErr):
			if len(body) > MaxBodyBytes {
				t.Fatalf("body of %d bytes not refused as too large: %v", len(body), err)
			}
			if fieldErr.Field == "" || fieldErr.Reason == "" {
				t.Fatalf("field error without field or reason: %#v", fieldErr)
			}
		default:
			t.Fatalf("error %T %v is neither a *FieldError nor ErrBodyTooLarge", err, err)
		}
		return
	}
	if len(body) > MaxBodyBytes {
		t.Fatalf("body of %d bytes accepted", len(body))
	}

	// What was accepted survives a round trip.
	encoded, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encode %+v: %v", v, err)
	}
	again := newBody()
	if err := DecodeBytes(encoded, again); err != nil {
		t.Fatalf("decode re-encoded %s: %v", encoded, err)
	}
	if diff := cmp.Diff(v, again, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("round trip of %q through %s (-first +second):\n%s", body, encoded, diff)
	}

	// A second value after the accepted one is refused, naming the body.
	err = DecodeBytes(append(bytes.Clone(body), " {}"...), newBody())
	var fieldErr *FieldError
	if !errors.As(err, &fieldErr) || fieldErr.Field != "body" {
		t.Fatalf("body %q followed by another value: error %v, want a field error on body", body, err)
	}

	// An unknown field next to the accepted ones is refused, naming it.
	withUnknown := append([]byte(`{"berthUnknownField":0,`), encoded[1:]...)
	err = DecodeBytes(withUnknown, newBody())
	if !errors.As(err, &fieldErr) || fieldErr.Field != "berthUnknownField" {
		t.Fatalf("body %s: error %v, want a field error on berthUnknownField", withUnknown, err)
	}
}

func FuzzDecode(f *testing.F) {
	seeds := []string{
		``,
		`{}`,
		`null`,
		`[]`,
		`"holder"`,
		`{"holder":"cluster-a","ttlSeconds":15}`,
		`{"holder":"cluster-a/x","fencingToken":3,"ttlSeconds":15}`,
		`{"holder":"cluster-a","fencingToken":2147483647}`,
		`{"holder":"cluster-a","fencingToken":2147483648}`,
		`{"holder":"a","ttlSeconds":-1}`,
		`{"holder":"a","ttlSeconds":1.5}`,
		`{"holder":"a","ttlSeconds":1e3}`,
		`{"holder":"a","ttlSeconds":"15"}`,
		`{"holder":null,"ttlSeconds":null}`,
		`{"holder":"\u00e9\ud800","ttlSeconds":1}`,
		"{\"holder\":\"\xff\xfe\",\"ttlSeconds\":1}",
		`{"holder":"a","holder":"b"}`,
		`{"holder":"a"} {"holder":"b"}`,
		`{"holder":"a"}x`,
		`{"holder":"a"}` + "\n\t ",
		`{"holder":"a",}`,
		`{"holder":"a","ttl":5}`,
		`{"":0}`,
		`{"a\"b":0}`,
		`{"fingerprint":"sha256:abc","agentVersion":"v0.1.0","labels":{"region":"eu","tier":"gold"}}`,
		`{"fingerprint":"f","labels":{}}`,
		`{"fingerprint":"f","labels":null}`,
		`{"fingerprint":"f","labels":{"a":1}}`,
		`{"fingerprint":"f","labels":{"a":"b","a":"c"}}`,
		`{"fingerprint":"f","labels":[]}`,
		`{"holder":"` + strings.Repeat("h", MaxBodyBytes) + `"}`,
		`{"holder":"a"}` + strings.Repeat(" ", MaxBodyBytes-len(`{"holder":"a"}`)),
		`{"holder":"a"}` + strings.Repeat(" ", MaxBodyBytes+1-len(`{"holder":"a"}`)),
		strings.Repeat("[", 10000),
	}
	for _, s := range seeds {
		for kind := range uint8(5) {
			f.Add(kind, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		switch kind % 5 {
		case 4:
			checkDecode(t, body, func() any { return &MoveRequest{} })
		case 0:
			checkDecode(t, body, func() any { return &AcquireRequest{} })
		case 1:
			checkDecode(t, body, func() any { return &RenewRequest{} })
		case 2:
			checkDecode(t, body, func() any { return &ReleaseRequest{} })
		case 3:
			checkDecode(t, body, func() any { return &ClusterRegistration{} })
		}
	})
}

// The documented key rules, written out independently of the validation
// package: namespace an RFC 1123 label, name an RFC 1123 subdomain,
// "namespace.name" at most 253 characters.
var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func keyFollowsRules(ns, name string) bool {
	return len(ns) <= 63 && dnsLabel.MatchString(ns) &&
		len(name) <= 253 && dnsSubdomain.MatchString(name) &&
		len(ns)+1+len(name) <= MaxKeyLength
}

func FuzzParseKey(f *testing.F) {
	seeds := []string{
		"default/lease",
		"ns/a.b.c",
		"team-a/web-0.primary",
		"a/" + strings.Repeat("b", 251), // namespace.name exactly 253
		"a/" + strings.Repeat("b", 252), // 254
		"a/" + strings.Repeat("b", 253), // name alone at its own limit
		strings.Repeat("n", 63) + "/x",
		strings.Repeat("n", 64) + "/x",
		strings.Repeat("n", 63) + "/" + strings.Repeat("b", 189), // 253
		strings.Repeat("n", 63) + "/" + strings.Repeat("b", 190), // 254
		"a/" + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63),
		"a/" + strings.Repeat("b", 64),
		"NS/name",
		"ns/Name",
		"ns/-name",
		"-ns/name",
		"ns-/name",
		"ns/name-",
		"ns/name.",
		"ns/.name",
		"ns/a..b",
		"n.s/name",
		"ns/a/b",
		"ns/a_b",
		"ns/",
		"/name",
		"/",
		"",
		"nsname",
		"ns/\u00e9",
		"ns/a\x00",
		"0/0",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		ns, name, cut := strings.Cut(s, "/")
		valid := cut && keyFollowsRules(ns, name)
		if err != nil {
			var fieldErr *FieldError
			if !errors.As(err, &fieldErr) {
				t.Fatalf("ParseKey(%q): error %T %v is not a *FieldError", s, err, err)
			}
			if fieldErr.Field != "key" && fieldErr.Field != "namespace" && fieldErr.Field != "name" {
				t.Fatalf("ParseKey(%q): error names field %q", s, fieldErr.Field)
			}
			if valid {
				t.Fatalf("ParseKey(%q) refused a key that follows the rules: %v", s, err)
			}
			return
		}
		if !valid {
			t.Fatalf("ParseKey(%q) = %+v, but the key breaks the rules", s, k)
		}
		if k.String() != s {
			t.Fatalf("ParseKey(%q).String() = %q", s, k.String())
		}
		again, err := ParseKey(k.String())
		if err != nil {
			t.Fatalf("ParseKey(%q) of its own String(): %v", k.String(), err)
		}
		if diff := cmp.Diff(k, again); diff != "" {
			t.Fatalf("round trip of %q (-first +second):\n%s", s, diff)
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("Validate of parsed key %+v: %v", k, err)
		}
	})
}

func TestDecodeNamesField(t *testing.T) {
	type target func() any
	acquire := func() any { return &AcquireRequest{} }
	renew := func() any { return &RenewRequest{} }
	register := func() any { return &ClusterRegistration{} }
	cases := map[string]struct {
		body         string
		into         target
		wantField    string
		wantTooLarge bool
	}{
		"empty body":                 {body: "", into: acquire, wantField: "body"},
		"truncated JSON":             {body: `{"holder":`, into: acquire, wantField: "body"},
		"syntax error":               {body: `{"holder" "a"}`, into: acquire, wantField: "body"},
		"two JSON values":            {body: `{"holder":"a","ttlSeconds":1}{"holder":"b"}`, into: acquire, wantField: "body"},
		"trailing garbage":           {body: `{"holder":"a","ttlSeconds":1} x`, into: acquire, wantField: "body"},
		"array instead of object":    {body: `[{"holder":"a"}]`, into: acquire, wantField: "body"},
		"unknown field":              {body: `{"holder":"a","ttl":5}`, into: acquire, wantField: "ttl"},
		"unknown field with a quote": {body: `{"holder":"a","t\"l":5}`, into: acquire, wantField: `t"l`},
		"key in another case":        {body: `{"HOLDER":"a","ttlSeconds":5}`, into: acquire, wantField: "HOLDER"},
		"duplicate key":              {body: `{"holder":"a","holder":"b","ttlSeconds":5}`, into: acquire, wantField: "holder"},
		"unknown empty field":        {body: `{"":5}`, into: acquire, wantField: "body"},
		"ttlSeconds as a string":     {body: `{"holder":"a","ttlSeconds":"5"}`, into: acquire, wantField: "ttlSeconds"},
		"ttlSeconds over int32":      {body: `{"holder":"a","ttlSeconds":2147483648}`, into: acquire, wantField: "ttlSeconds"},
		"fencingToken not integral":  {body: `{"holder":"a","fencingToken":1.5,"ttlSeconds":1}`, into: renew, wantField: "fencingToken"},
		"holder as a number":         {body: `{"holder":7}`, into: renew, wantField: "holder"},
		"labels as a list":           {body: `{"fingerprint":"f","labels":["a"]}`, into: register, wantField: "labels"},
		"body over 4 KiB":            {body: `{"holder":"` + strings.Repeat("h", MaxBodyBytes) + `"}`, into: acquire, wantTooLarge: true},
		"body of exactly 4 KiB":      {body: `{"holder":"a","ttlSeconds":1}` + strings.Repeat(" ", MaxBodyBytes-len(`{"holder":"a","ttlSeconds":1}`)), into: acquire},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := Decode(strings.NewReader(tc.body), tc.into())
			if got := errors.Is(err, ErrBodyTooLarge); got != tc.wantTooLarge {
				t.Fatalf("error %v: too large = %v, want %v", err, got, tc.wantTooLarge)
			}
			var fieldErr *FieldError
			gotField := ""
			if errors.As(err, &fieldErr) {
				gotField = fieldErr.Field
			}
			if diff := cmp.Diff(tc.wantField, gotField); diff != "" {
				t.Errorf("field named by %v (-want +got):\n%s", err, diff)
			}
		})
	}
}

func TestValidateNamesField(t *testing.T) {
	long := strings.Repeat("h", MaxHolderBytes+1)
	cases := map[string]struct {
		req        interface{ Validate() error }
		wantFields []string
	}{
		"valid acquire":                       {req: &AcquireRequest{Holder: "a", TTLSeconds: 1}},
		"empty holder":                        {req: &AcquireRequest{TTLSeconds: 1}, wantFields: []string{"holder"}},
		"holder of 253 bytes":                 {req: &AcquireRequest{Holder: long[:MaxHolderBytes], TTLSeconds: 1}},
		"holder over 253 bytes":               {req: &AcquireRequest{Holder: long, TTLSeconds: 1}, wantFields: []string{"holder"}},
		"ttlSeconds zero":                     {req: &AcquireRequest{Holder: "a"}, wantFields: []string{"ttlSeconds"}},
		"ttlSeconds over a day":               {req: &AcquireRequest{Holder: "a", TTLSeconds: MaxTTLSeconds + 1}, wantFields: []string{"ttlSeconds"}},
		"renew without token":                 {req: &RenewRequest{Holder: "a", TTLSeconds: 1}, wantFields: []string{"fencingToken"}},
		"renew, all wrong":                    {req: &RenewRequest{FencingToken: -1}, wantFields: []string{"holder", "fencingToken", "ttlSeconds"}},
		"release without holder":              {req: &ReleaseRequest{FencingToken: 1}, wantFields: []string{"holder"}},
		"valid move anywhere":                 {req: &MoveRequest{Holder: "east/app", FencingToken: 1}},
		"valid move to a cluster":             {req: &MoveRequest{Holder: "east/app", FencingToken: 1, To: "west"}},
		"move to the holder's own cluster":    {req: &MoveRequest{Holder: "east/app", FencingToken: 1, To: "east"}, wantFields: []string{"to"}},
		"move to a bad cluster id":            {req: &MoveRequest{Holder: "east", FencingToken: 1, To: "West_1"}, wantFields: []string{"to"}},
		"move without holder, token or place": {req: &MoveRequest{To: "-"}, wantFields: []string{"holder", "fencingToken", "to"}},
		"registration without fingerprint": {
			req: &ClusterRegistration{}, wantFields: []string{"fingerprint"},
		},
		"registration with a bad label": {
			req: &ClusterRegistration{Fingerprint: "f", Labels: map[string]string{"bad key!": "v"}}, wantFields: []string{"labels"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.req.Validate()
			var gotFields []string
			if err != nil {
				var errs []error
				if joined, ok := err.(interface{ Unwrap() []error }); ok {
					errs = joined.Unwrap()
				} else {
					errs = []error{err}
				}
				for _, e := range errs {
					var fieldErr *FieldError
					if !errors.As(e, &fieldErr) {
						t.Fatalf("error %v is not a *FieldError", e)
					}
					gotFields = append(gotFields, fieldErr.Field)
				}
			}
			if diff := cmp.Diff(tc.wantFields, gotFields); diff != "" {
				t.Errorf("fields named by %v (-want +got):\n%s", err, diff)
			}
		})
	}
}
