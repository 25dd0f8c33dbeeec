package flags

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

func TestGoStyle(t *testing.T) {
	cases := map[string]struct {
		args []string
		want []string
	}{
		"double dash stays":              {args: []string{"--cluster-id=east"}, want: []string{"--cluster-id=east"}},
		"single dash with value":         {args: []string{"-cluster-id=east"}, want: []string{"--cluster-id=east"}},
		"single dash, value after":       {args: []string{"-cluster-id", "east"}, want: []string{"--cluster-id", "east"}},
		"boolean":                        {args: []string{"-leader-elect"}, want: []string{"--leader-elect"}},
		"shorthand stays":                {args: []string{"-v", "2", "-v=3"}, want: []string{"-v", "2", "-v=3"}},
		"unknown long flag is left":      {args: []string{"-nope=1"}, want: []string{"-nope=1"}},
		"a value that looks like a flag": {args: []string{"-cluster-id", "-leader-elect"}, want: []string{"--cluster-id", "-leader-elect"}},
		"a value after a shorthand":      {args: []string{"-v", "-2"}, want: []string{"-v", "-2"}},
		"after the terminator, nothing":  {args: []string{"--", "-cluster-id=east"}, want: []string{"--", "-cluster-id=east"}},
		"lone dash":                      {args: []string{"-"}, want: []string{"-"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			fs.String("cluster-id", "", "")
			fs.Bool("leader-elect", false, "")
			fs.IntP("v", "v", 0, "")
			if diff := cmp.Diff(tc.want, GoStyle(fs, tc.args)); diff != "" {
				t.Errorf("GoStyle(%q) (-want +got):\n%s", tc.args, diff)
			}
		})
	}
}

func TestParseAcceptsGoSpellings(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	id := fs.String("cluster-id", "", "")
	elect := fs.Bool("leader-elect", false, "")
	v := fs.IntP("v", "v", 0, "")
	if err := Parse(fs, []string{"-cluster-id=east", "-leader-elect", "-v", "2"}); err != nil {
		t.Fatal(err)
	}
	if *id != "east" || !*elect || *v != 2 {
		t.Errorf("parsed cluster-id=%q leader-elect=%v v=%d; want east, true, 2", *id, *elect, *v)
	}
}

func TestVersion(t *testing.T) {
	cases := map[string]struct {
		args []string
		want bool
	}{
		"absent":             {want: false},
		"--version":          {args: []string{"--version"}, want: true},
		"Go flag's -version": {args: []string{"-version"}, want: true},
		"--version=false":    {args: []string{"--version=false"}, want: false},
		"with other flags":   {args: []string{"--listen", ":8443", "--version"}, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			fs.String("listen", "", "")
			var show bool
			Version(fs, &show)
			if err := Parse(fs, tc.args); err != nil {
				t.Fatal(err)
			}
			if show != tc.want {
				t.Errorf("show = %t, want %t", show, tc.want)
			}
		})
	}
	if got, want := VersionLine("berth-agent", "v1.2.3"), "berth-agent v1.2.3"; got != want {
		t.Errorf("VersionLine = %q, want %q", got, want)
	}
}
