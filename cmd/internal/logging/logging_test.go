package logging

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want Options
	}{
		"defaults":        {want: Options{Format: FormatText}},
		"long v":          {args: []string{"--v=4"}, want: Options{Format: FormatText, Verbosity: 4}},
		"short v":         {args: []string{"-v", "1"}, want: Options{Format: FormatText, Verbosity: 1}},
		"short v joined":  {args: []string{"-v=2"}, want: Options{Format: FormatText, Verbosity: 2}},
		"json":            {args: []string{"--log-format", "json"}, want: Options{Format: FormatJSON}},
		"vmodule":         {args: []string{"--vmodule=run=4"}, want: Options{Format: FormatText, VModule: "run=4"}},
		"all, mixed form": {args: []string{"--log-format=json", "--v", "3"}, want: Options{Format: FormatJSON, Verbosity: 3}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := NewOptions(FormatText)
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, *o); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNew(t *testing.T) {
	cases := map[string]struct {
		o       Options
		wantErr bool
		// want are substrings of the output, wantNot must not appear.
		want, wantNot []string
	}{
		"text": {
			o:       Options{Format: FormatText},
			want:    []string{`] "lease acquired" cluster="east" lease="team/exporter" token=7`, `] "renew failed" err="boom" cluster="east"`},
			wantNot: []string{"flow"},
		},
		"text at v1": {
			o:    Options{Format: FormatText, Verbosity: 1},
			want: []string{`] "flow" cluster="east"`},
		},
		"text with vmodule": {
			o:    Options{Format: FormatText, VModule: "logging_test=1"},
			want: []string{`] "flow" cluster="east"`},
		},
		"json": {
			o:       Options{Format: FormatJSON},
			want:    []string{`"level":"INFO","msg":"lease acquired","cluster":"east","lease":"team/exporter","token":7}`, `"level":"ERROR","msg":"renew failed","cluster":"east","err":"boom"}`},
			wantNot: []string{"flow"},
		},
		"json at v1": {
			o:    Options{Format: FormatJSON, Verbosity: 1},
			want: []string{`"msg":"flow","cluster":"east"}`},
		},
		"json refuses vmodule": {o: Options{Format: FormatJSON, VModule: "x=1"}, wantErr: true},
		"unknown format":       {o: Options{Format: "logfmt"}, wantErr: true},
		"negative verbosity":   {o: Options{Format: FormatText, Verbosity: -1}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			log, err := tc.o.New(&out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("New() error %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			log = log.WithValues("cluster", "east")
			log.Info("lease acquired", "lease", "team/exporter", "token", 7)
			log.V(1).Info("flow")
			log.Error(errors.New("boom"), "renew failed")
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %s:\n%s", w, out.String())
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %s:\n%s", w, out.String())
				}
			}
		})
	}
}
