package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// The formats of --log-format.
const (
	// FormatText is klog's text line: I0102 15:04:05.000000 pid file:line] "msg" key="value".
	FormatText = "text"
	// FormatJSON is one JSON object a line: {"time","level","msg",key:value...}.
	FormatJSON = "json"
)

// Options are the logging flags every Berth command takes.
type Options struct {
	// Format is FormatText or FormatJSON.
	Format string
	// Verbosity shows V(n) lines for n <= Verbosity.
	Verbosity int
	// VModule overrides Verbosity per file (pattern=N,...); text only.
	VModule string
}

// NewOptions are the defaults of a command whose logs are in format.
func NewOptions(format string) *Options { return &Options{Format: format} }

// AddFlags registers --log-format, -v/--v and --vmodule on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Format, "log-format", o.Format, "log format: text (klog lines) or json (one object a line)")
	fs.IntVarP(&o.Verbosity, "v", "v", o.Verbosity, "log verbosity: 0 state changes and requests, 1 flow, 4 trace")
	fs.StringVar(&o.VModule, "vmodule", o.VModule, "comma-separated pattern=N settings of the verbosity per file (text format only)")
}

// New builds the logger the options describe, writing to w.
func (o *Options) New(w io.Writer) (logr.Logger, error) {
	if o.Verbosity < 0 {
		return logr.Discard(), fmt.Errorf("-v %d: want 0 or more", o.Verbosity)
	}
	switch o.Format {
	case FormatText:
		cfg := textlogger.NewConfig(textlogger.Verbosity(o.Verbosity), textlogger.Output(w))
		if o.VModule != "" {
			if err := cfg.VModule().Set(o.VModule); err != nil {
				return logr.Discard(), fmt.Errorf("--vmodule %q: %w", o.VModule, err)
			}
		}
		return textlogger.NewLogger(cfg), nil
	case FormatJSON:
		if o.VModule != "" {
			return logr.Discard(), fmt.Errorf("--vmodule works with --log-format=%s only", FormatText)
		}
		h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(-o.Verbosity)})
		return logr.FromSlogHandler(h), nil
	default:
		return logr.Discard(), fmt.Errorf("--log-format %q: want %s or %s", o.Format, FormatText, FormatJSON)
	}
}

// Install makes log the logger of klog and of controller-runtime, so that
// what they log comes out in the same format.
func Install(log logr.Logger) {
	klog.SetLogger(log)
	ctrllog.SetLogger(log)
}
