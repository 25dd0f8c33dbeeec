package main

import (
	"os"
	"testing"
)

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]struct {
		o       options
		wantErr bool
	}{
		"single-cluster":                  {o: options{leaseAPIURL: "http://x"}},
		"no lease API":                    {o: options{}, wantErr: true},
		"fleet mode":                      {o: options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir}},
		"fleet mode with leader election": {o: options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, leaderElect: true, kubeconfig: "host.kubeconfig"}},
		"fleet mode elects on no host":    {o: options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, leaderElect: true}, wantErr: true},
		"fleet mode names its clusters":   {o: options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, clusterID: "east"}, wantErr: true},
		"fleet folder missing":            {o: options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir + "/missing"}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := tc.o.validate(); (err != nil) != tc.wantErr {
				t.Errorf("validate() = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

func TestClusterTokenFile(t *testing.T) {
	dir := t.TempDir()
	o := options{fleetKubeconfigDir: dir, leaseAPITokenFile: "/shared.token"}
	if got := clusterTokenFile(o, "east"); got != "/shared.token" {
		t.Errorf("without east.token: %q, want the shared --lease-api-token-file", got)
	}
	if err := writeFile(dir + "/east.token"); err != nil {
		t.Fatal(err)
	}
	if got, want := clusterTokenFile(o, "east"), dir+"/east.token"; got != want {
		t.Errorf("with east.token: %q, want %q", got, want)
	}
}

func writeFile(path string) error { return os.WriteFile(path, []byte("token"), 0o600) }
