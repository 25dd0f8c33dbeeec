package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"time"

	"github.com/berthfleet/berth/leaseapi"
)

// DefaultWatchIdleTimeout is three of the server's bookmark intervals: a
// stream quiet for that long is dead.
const DefaultWatchIdleTimeout = 30 * time.Second

// The pauses of WatchLeases between broken streams: jittered, doubling from
// the first to the last, and back to the first once a stream is up again.
const (
	watchRetryFirst = 100 * time.Millisecond
	watchRetryLast  = 3 * time.Second
)

// maxWatchLine bounds one line of a stream.
const maxWatchLine = 1 << 20

// LeaseEvent is what WatchLeases hands its callback.
type LeaseEvent struct {
	// Reset: changes may have been missed (the watch started, or could not
	// resume): re-read every lease of interest. Lease is empty.
	Reset bool
	// Lease is the changed lease when Reset is false.
	Lease leaseapi.Lease
}

var (
	// errWatchQuiet: no line within the idle timeout (or, for a new
	// stream, within the call timeout).
	errWatchQuiet = errors.New("no line from the watch stream in time")
	// errWatchEnded: the server ended the stream (its maximum duration, a
	// shutdown); the watch resumes.
	errWatchEnded = errors.New("the server ended the watch stream")
)

// WatchLeases follows lease changes in namespaces (every namespace when
// empty) until ctx ends, and then returns ctx.Err(). It reconnects after a
// broken stream (with backoff, at most a few seconds), resuming from the
// last revision seen; handle is called from one goroutine, in order, and
// must not block long. Every stream that does not resume begins with a
// Reset event, so the first event is always a Reset. A stream with no line
// for 3 bookmark intervals is treated as broken. connected, if not nil, is
// called with true when a stream is established and false when it breaks.
//
// A server of an earlier release, which does not know the route, makes it
// return at once an error matching ErrNotSupported; 400, 401 and 403
// (ErrInvalid, ErrUnauthorized, ErrForbidden) are returned at once too.
// Anything else is retried. Config.Timeout bounds connecting and the first
// line of each stream, not the stream itself.
func (c *Client) WatchLeases(ctx context.Context, namespaces []string, handle func(LeaseEvent), connected func(bool)) error {
	w := &leaseWatch{namespaces: namespaces, handle: handle, connected: connected}
	attempt := 0
	for {
		established, err := c.streamLeases(ctx, w)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if permanentWatchError(err) {
			return fmt.Errorf("watch leases: %w", err)
		}
		if established {
			attempt = 0
		}
		wait := watchRetry(attempt)
		attempt++
		c.log.V(1).Info("lease watch broke; resuming", "error", err.Error(), "revision", w.revision, "after", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// leaseWatch is the state WatchLeases carries from one stream to the next.
type leaseWatch struct {
	namespaces []string
	handle     func(LeaseEvent)
	connected  func(bool)
	// revision is the last one seen, to resume from.
	revision string
	// started: a Reset has been handed on.
	started bool
}

// apply hands on what one line says and remembers its revision.
func (w *leaseWatch) apply(e leaseapi.WatchEvent) {
	switch e.Type {
	case leaseapi.WatchReset:
		w.started = true
		w.handle(LeaseEvent{Reset: true})
	case leaseapi.WatchChanged:
		if e.Lease == nil {
			return
		}
		if !w.started {
			// Not what a server sends; the caller is promised a Reset first.
			w.started = true
			w.handle(LeaseEvent{Reset: true})
		}
		w.handle(LeaseEvent{Lease: *e.Lease})
	case leaseapi.WatchBookmark:
	default:
		return // a type of a later release: skipped whole
	}
	if e.Revision != "" {
		w.revision = e.Revision
	}
}

// streamLeases follows one stream until it breaks, and reports whether it
// was established (a line arrived).
func (c *Client) streamLeases(ctx context.Context, w *leaseWatch) (established bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Connecting and the first line take at most the call timeout; each
	// later line at most the idle timeout.
	watchdog := time.AfterFunc(c.timeout, func() { cancel(errWatchQuiet) })
	defer watchdog.Stop()
	defer func() {
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, errWatchQuiet) {
			err = cause
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+watchPath(w.namespaces, w.revision), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	if err := c.authorize(req.Header); err != nil {
		return false, err
	}
	resp, err := c.http.HTTPClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		err := apiError(resp, data)
		if resp.StatusCode == http.StatusNotFound {
			return false, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return false, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4<<10), maxWatchLine)
	for sc.Scan() {
		watchdog.Reset(c.watchIdle)
		var e leaseapi.WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return established, fmt.Errorf("decode watch line: %w", err)
		}
		if !established {
			established = true
			if w.connected != nil {
				w.connected(true)
				defer w.connected(false)
			}
		}
		w.apply(e)
	}
	if err := sc.Err(); err != nil {
		return established, fmt.Errorf("read watch stream: %w", err)
	}
	return established, errWatchEnded
}

// watchPath is the watch route for namespaces, resuming from revision.
func watchPath(namespaces []string, revision string) string {
	q := url.Values{}
	for _, ns := range namespaces {
		q.Add("namespace", ns)
	}
	if revision != "" {
		q.Set("revision", revision)
	}
	if len(q) == 0 {
		return "/v1alpha1/watch/leases"
	}
	return "/v1alpha1/watch/leases?" + q.Encode()
}

// permanentWatchError reports whether a stream's error ends WatchLeases: a
// server without the route, a refused request or credentials. Everything
// else (the network, 429, 5xx, a stream cut) is retried.
func permanentWatchError(err error) bool {
	return errors.Is(err, ErrNotSupported) || errors.Is(err, ErrInvalid) ||
		errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden)
}

// watchRetry is the pause before the attempt after attempt broken ones:
// full jitter under a ceiling that doubles from watchRetryFirst to
// watchRetryLast.
func watchRetry(attempt int) time.Duration {
	ceiling := min(watchRetryFirst<<min(attempt, 16), watchRetryLast)
	return ceiling/2 + rand.N(ceiling/2+1)
}
