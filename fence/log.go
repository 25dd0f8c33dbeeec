package fence

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LogPrefix starts every line berth-fence writes.
const LogPrefix = "berth-fence:"

// The events of berth-fence's log: each line is
//
//	berth-fence: <RFC3339Nano time> <event>[ key=value ...]
//
// with values quoted (Go syntax) when they hold a space, a quote or an equals
// sign. Tests and operators match on the event; docs/fencing.md lists them.
const (
	EventWaitingIdentity      = "waiting for identity"
	EventWaiting              = "waiting for confirmation"
	EventConfirmed            = "confirmed"
	EventChildStarted         = "child started"
	EventConfirmFailed        = "confirmation failed"
	EventConfirmationLost     = "confirmation lost"
	EventStopping             = "stopping"
	EventSIGKILL              = "SIGKILL"
	EventSignalForwarded      = "signal forwarded"
	EventChildExited          = "child exited"
	EventExiting              = "exiting"
	EventStartFailed          = "start failed"
	EventSignalBeforeStart    = "signal before start"
	EventInstalled            = "installed"
	EventConfirmationRestored = "confirmation restored"
)

// Logger writes berth-fence's event lines. It is safe for concurrent use.
type Logger struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

// NewLogger writes lines to w, stamped with the wall clock.
func NewLogger(w io.Writer) *Logger { return &Logger{w: w, now: time.Now} }

// Event writes one line: the event and its key-value pairs.
func (l *Logger) Event(event string, kv ...any) {
	var b strings.Builder
	b.WriteString(LogPrefix)
	b.WriteByte(' ')
	b.WriteString(l.now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(event)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%s", kv[i], formatValue(kv[i+1]))
	}
	b.WriteByte('\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, b.String())
}

func formatValue(v any) string {
	var s string
	switch v := v.(type) {
	case time.Duration:
		s = v.Round(time.Millisecond).String()
	case error:
		s = v.Error()
	case string:
		s = v
	default:
		s = fmt.Sprint(v)
	}
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		return strconv.Quote(s)
	}
	return s
}
