package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
)

// WatchOptions pace and bound watch streams (GET /v1alpha1/watch/leases).
type WatchOptions struct {
	// BookmarkInterval is the quiet time after which a stream is sent a
	// bookmark, so that its client can tell a quiet stream from a dead one.
	BookmarkInterval time.Duration
	// MaxDuration bounds one stream; it ends cleanly a little before (up to
	// a tenth, at random) and its client resumes, so that long-lived streams
	// spread over the replicas behind a load balancer as they come and go.
	MaxDuration time.Duration
	// WriteTimeout bounds writing one line: a client that stops reading is
	// cut off then, instead of holding the server's buffers.
	WriteTimeout time.Duration
	// MaxWatches bounds the open streams of the server, and
	// MaxWatchesPerSubject those of one authenticated subject; more are
	// answered 429.
	MaxWatches           int
	MaxWatchesPerSubject int
}

// The default WatchOptions.
const (
	DefaultBookmarkInterval     = 10 * time.Second
	DefaultMaxWatchDuration     = 30 * time.Minute
	DefaultWatchWriteTimeout    = 10 * time.Second
	DefaultMaxWatches           = 10000
	DefaultMaxWatchesPerSubject = 100
)

// watchBatch bounds the events taken from the change log at once.
const watchBatch = 256

func (o WatchOptions) withDefaults() WatchOptions {
	if o.BookmarkInterval <= 0 {
		o.BookmarkInterval = DefaultBookmarkInterval
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = DefaultMaxWatchDuration
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWatchWriteTimeout
	}
	if o.MaxWatches <= 0 {
		o.MaxWatches = DefaultMaxWatches
	}
	if o.MaxWatchesPerSubject <= 0 {
		o.MaxWatchesPerSubject = DefaultMaxWatchesPerSubject
	}
	return o
}

// errTooManyWatches answers a watch over MaxWatches or MaxWatchesPerSubject.
var errTooManyWatches = errors.New("too many watches")

// watches counts the open streams, and ends them all at shutdown.
type watches struct {
	mu        sync.Mutex
	total     int
	bySubject map[string]int
	stop      chan struct{}
	stopOnce  sync.Once
}

func newWatches() *watches {
	return &watches{bySubject: map[string]int{}, stop: make(chan struct{})}
}

// admit counts a new stream of subject, or refuses it over the bounds. The
// caller calls done when the stream ends. Without authentication there are
// no subjects, and only the server's bound applies.
func (ws *watches) admit(subject string, o WatchOptions) (done func(), err error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	switch {
	case ws.total >= o.MaxWatches:
		return nil, fmt.Errorf("%w: the server has %d open", errTooManyWatches, ws.total)
	case subject != "" && ws.bySubject[subject] >= o.MaxWatchesPerSubject:
		return nil, fmt.Errorf("%w: subject %q has %d open", errTooManyWatches, subject, ws.bySubject[subject])
	}
	ws.total++
	ws.bySubject[subject]++
	return func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		ws.total--
		if ws.bySubject[subject]--; ws.bySubject[subject] == 0 {
			delete(ws.bySubject, subject)
		}
	}, nil
}

// EndWatches ends every open watch stream, and every one that starts later,
// cleanly: their clients resume elsewhere. http.Server.Shutdown waits for
// streams that never end on their own; register this with
// RegisterOnShutdown.
func (s *Server) EndWatches() {
	s.watches.stopOnce.Do(func() { close(s.watches.stop) })
}

// watchLeases streams the lease changes in the namespaces asked for (every
// namespace when none) as newline-delimited JSON, from the revision given or
// with a reset first, until the client leaves, the stream's maximum
// duration passes, a line cannot be written in time, or the server shuts
// down.
func (s *Server) watchLeases(w http.ResponseWriter, r *http.Request, p Principal) error {
	q := r.URL.Query()
	namespaces := q["namespace"]
	for _, ns := range namespaces {
		if err := (leaseapi.Key{Namespace: ns, Name: "x"}).Validate(); err != nil {
			return err
		}
	}
	done, err := s.watches.admit(p.Subject, s.Watch)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		return err
	}
	defer done()
	s.Metrics.watchesOpen.Inc()
	defer s.Metrics.watchesOpen.Dec()

	st := newStream(w, s.Watch.WriteTimeout, s.Metrics)
	defer st.clearDeadline()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	err = s.stream(r.Context(), st, s.Service.Watch(namespaces, q.Get("revision")))
	if err != nil {
		s.Log.V(1).Info("watch stream cut", "requestId", requestID(r), "subject", p.Subject, "reason", err.Error())
	}
	return nil
}

// stream writes the watcher's events to st until the stream ends; an error
// is a line that could not be written.
func (s *Server) stream(ctx context.Context, st *stream, watcher *lease.Watcher) error {
	end := time.NewTimer(jittered(s.Watch.MaxDuration))
	defer end.Stop()
	bookmark := time.NewTimer(s.Watch.BookmarkInterval)
	defer bookmark.Stop()
	first := true
	for {
		events, more := watcher.Next(watchBatch)
		if first && len(events) == 0 {
			// A resumed stream with nothing to replay: a first line at
			// once, so that the client knows the stream is up.
			if err := st.send(bookmarkEvent(watcher.Revision())); err != nil {
				return err
			}
		}
		first = false
		for _, e := range events {
			if e.Reset != "" {
				s.Metrics.watchResets.WithLabelValues(string(e.Reset)).Inc()
			}
			if err := st.send(wireEvent(e)); err != nil {
				return err
			}
		}
		if len(events) > 0 {
			bookmark.Reset(s.Watch.BookmarkInterval)
		}
		select {
		case <-more:
		case <-bookmark.C:
			if err := st.send(bookmarkEvent(watcher.Revision())); err != nil {
				return err
			}
			bookmark.Reset(s.Watch.BookmarkInterval)
		case <-end.C:
			return nil
		case <-ctx.Done():
			return nil
		case <-s.watches.stop:
			return nil
		}
	}
}

// stream writes the lines of one watch, each flushed under a write
// deadline.
type stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	metrics *Metrics
	// deadlines is false for a writer that takes none (a test's recorder).
	deadlines bool
}

func newStream(w http.ResponseWriter, timeout time.Duration, m *Metrics) *stream {
	st := &stream{w: w, rc: http.NewResponseController(w), timeout: timeout, metrics: m}
	st.deadlines = st.rc.SetWriteDeadline(time.Time{}) == nil
	return st
}

// send writes e as one line and flushes it, within the write timeout.
func (st *stream) send(e leaseapi.WatchEvent) error {
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode watch event: %w", err)
	}
	line = append(line, '\n')
	if st.deadlines {
		if err := st.rc.SetWriteDeadline(time.Now().Add(st.timeout)); err != nil {
			return err
		}
	}
	if _, err := st.w.Write(line); err != nil {
		return err
	}
	if err := st.rc.Flush(); err != nil {
		return err
	}
	st.metrics.watchEvents.WithLabelValues(e.Type).Inc()
	return nil
}

// clearDeadline leaves the connection without a write deadline, for the
// next request on it.
func (st *stream) clearDeadline() {
	if st.deadlines {
		_ = st.rc.SetWriteDeadline(time.Time{})
	}
}

// jittered is d less up to a tenth of it, at random.
func jittered(d time.Duration) time.Duration {
	return d - rand.N(d/10+1)
}

func bookmarkEvent(revision string) leaseapi.WatchEvent {
	return leaseapi.WatchEvent{Type: leaseapi.WatchBookmark, Revision: revision}
}

// wireEvent is a change log event as the stream sends it.
func wireEvent(e lease.Event) leaseapi.WatchEvent {
	if e.Reset != "" {
		return leaseapi.WatchEvent{Type: leaseapi.WatchReset, Revision: e.Revision}
	}
	l := wireLease(e.Lease)
	return leaseapi.WatchEvent{Type: leaseapi.WatchChanged, Revision: e.Revision, Lease: &l}
}
