package lease

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// DefaultChangeLogSize is how many recent lease changes a Service keeps, so
// that a watch resumed from a revision can be replayed what it missed.
const DefaultChangeLogSize = 1 << 16

// ResetCause says why a watch is told that it may have missed changes.
type ResetCause string

// The causes of a reset.
const (
	// ResetStart: the watch gave no revision to resume from.
	ResetStart ResetCause = "start"
	// ResetUnknownRevision: the revision was not issued by this process (a
	// restarted server, another replica) or is not a revision at all.
	ResetUnknownRevision ResetCause = "unknown-revision"
	// ResetTooOld: the changes after the revision are no longer kept.
	ResetTooOld ResetCause = "too-old"
	// ResetBehind: the watcher fell further behind than the log keeps.
	ResetBehind ResetCause = "behind"
	// ResetFeed: the shared store's change feed (re)started, overflowed or
	// could not be read, so writes through other replicas may be missed.
	ResetFeed ResetCause = "feed"
)

// Event is what a Watcher hands on: a lease whose holder, fencing token or
// revocation changed, or, when Reset is set, word that changes before
// Revision may have been missed.
type Event struct {
	// Revision is where a watch resumed from here picks up.
	Revision string
	// Reset is set when the watcher must re-read every lease it cares about.
	Reset ResetCause
	// Lease is the changed record as Get shows it, when Reset is empty.
	Lease store.Lease
}

// newer reports whether lease record a comes after b in the history of
// their key. Along that history the fencing token only grows, and within one
// token a term goes from held to revoked to moving (anywhere, then to a
// named cluster) to free and reserved to free (release or expiry) and never
// back; so (token, phase) orders every state a key can be in. A record
// that is not newer than the last one logged is stale (two writes appended
// in the other order than they landed) or the same state reported twice (a
// local write that the store's feed reports again).
func newer(a, b store.Lease) bool {
	if a.FencingToken != b.FencingToken {
		return a.FencingToken > b.FencingToken
	}
	return phase(a) > phase(b)
}

// phase places a record within its term: held, revoked, moving to any
// other cluster, moving to a named one, free and reserved, then free. A
// move only ever narrows its destination (DecideMove), and a reservation
// is only ever cleared, so each step goes one way.
func phase(l store.Lease) int {
	switch {
	case l.Holder == "" && l.Reserved.IsZero():
		return 5
	case l.Holder == "":
		return 4
	case l.Moving && l.MoveTo != "":
		return 3
	case l.Moving:
		return 2
	case l.Revoked:
		return 1
	}
	return 0
}

// changed reports whether a write from prev to next is a change that watches
// see: a new holder, token, revocation, move or reservation. A renewal is
// not.
func changed(prev, next store.Lease) bool {
	return prev.Holder != next.Holder || prev.FencingToken != next.FencingToken || prev.Revoked != next.Revoked ||
		prev.Moving != next.Moving || prev.MoveTo != next.MoveTo || prev.Reserved != next.Reserved
}

// startOf decides where a watch that gives revision starts in a log of epoch
// whose newest change has number head and which keeps the last size changes:
// after the revision when every change since is kept, else at head with the
// cause of the reset that the watch must begin with.
func startOf(revision, epoch string, head uint64, size int) (cursor uint64, reset ResetCause) {
	if revision == "" {
		return head, ResetStart
	}
	n, ok := parseRevision(revision, epoch)
	switch {
	case !ok || n > head:
		return head, ResetUnknownRevision
	case head-n > uint64(size):
		return head, ResetTooOld
	}
	return n, ""
}

// parseRevision reads "<epoch>-<number>", the form formatRevision writes,
// and reports whether it is one of this epoch's.
func parseRevision(revision, epoch string) (uint64, bool) {
	e, num, ok := strings.Cut(revision, "-")
	if !ok || e != epoch {
		return 0, false
	}
	n, err := strconv.ParseUint(num, 10, 64)
	return n, err == nil
}

func formatRevision(epoch string, n uint64) string {
	return epoch + "-" + strconv.FormatUint(n, 10)
}

// changeLog numbers the lease changes this process learns of (its own
// writes, and other replicas' through the store's feed) and keeps the last
// ones in a ring for watchers to read and resume from. Memory is bounded by
// the ring whatever the watchers do: each watcher is only a position in it,
// and one that falls out of it starts over with a reset.
type changeLog struct {
	// epoch is random per process, so that a revision of another process
	// (a restarted server, another replica) is never taken for one of ours.
	epoch string

	mu   sync.Mutex
	head uint64 // number of the newest entry; 0 while empty
	ring []logEntry
	// latest is the number of the newest entry of each key still in the ring.
	latest map[leaseapi.Key]uint64
	// grown is closed, and replaced, when an entry is added.
	grown chan struct{}
}

// logEntry is one change: a lease record, or a reset.
type logEntry struct {
	n     uint64
	reset ResetCause
	lease store.Lease
}

func newChangeLog(size int) *changeLog {
	if size <= 0 {
		size = DefaultChangeLogSize
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &changeLog{
		epoch:  hex.EncodeToString(b[:]),
		ring:   make([]logEntry, size),
		latest: map[leaseapi.Key]uint64{},
		grown:  make(chan struct{}),
	}
}

// add logs l unless the log already has its state or a later one.
func (c *changeLog) add(l store.Lease) {
	key := leaseapi.Key{Namespace: l.Namespace, Name: l.Name}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.latest[key]; ok && !newer(l, c.ring[n%uint64(len(c.ring))].lease) {
		return
	}
	c.append(logEntry{lease: l})
	c.latest[key] = c.head
}

// reset logs that any lease may have changed unseen.
func (c *changeLog) reset(cause ResetCause) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.append(logEntry{reset: cause})
}

// append adds e as the newest entry, over the oldest; c.mu is held.
func (c *changeLog) append(e logEntry) {
	c.head++
	e.n = c.head
	slot := &c.ring[c.head%uint64(len(c.ring))]
	if old := *slot; old.n != 0 && old.reset == "" {
		key := leaseapi.Key{Namespace: old.lease.Namespace, Name: old.lease.Name}
		if c.latest[key] == old.n {
			delete(c.latest, key)
		}
	}
	*slot = e
	close(c.grown)
	c.grown = make(chan struct{})
}

// Watcher is a position in the change log of a Service, with the
// namespaces it follows. It holds nothing else: a watcher nobody reads costs
// no memory, and one that falls behind by more than the log keeps starts
// over with a reset. A Watcher is used by one goroutine.
type Watcher struct {
	log        *changeLog
	namespaces map[string]bool // nil: every namespace
	cursor     uint64          // the number of the last entry passed
	pending    ResetCause      // a reset to hand on first
}

// Watch returns a watcher of the lease changes in namespaces (every
// namespace when empty), resuming after revision when this process issued
// it and still keeps every change since; otherwise its first event is a
// reset.
func (s *Service) Watch(namespaces []string, revision string) *Watcher {
	w := &Watcher{log: s.changeLog}
	if len(namespaces) > 0 {
		w.namespaces = map[string]bool{}
		for _, ns := range namespaces {
			w.namespaces[ns] = true
		}
	}
	c := s.changeLog
	c.mu.Lock()
	defer c.mu.Unlock()
	w.cursor, w.pending = startOf(revision, c.epoch, c.head, len(c.ring))
	return w
}

// Next hands on up to max events after the watcher's position, in order,
// and moves past them, and returns a channel closed when there is more to
// read: at once when max cut the events short, else when the log grows.
// With nothing new it returns no events.
func (w *Watcher) Next(max int) ([]Event, <-chan struct{}) {
	c := w.log
	c.mu.Lock()
	defer c.mu.Unlock()
	size := uint64(len(c.ring))
	if c.head-w.cursor > size {
		// The entries after the cursor were overwritten.
		w.cursor, w.pending = c.head, ResetBehind
	}
	var out []Event
	if w.pending != "" {
		out = append(out, Event{Revision: formatRevision(c.epoch, w.cursor), Reset: w.pending})
		w.pending = ""
	}
	for w.cursor < c.head && len(out) < max {
		w.cursor++
		e := c.ring[w.cursor%size]
		switch {
		case e.reset != "":
			out = append(out, Event{Revision: formatRevision(c.epoch, e.n), Reset: e.reset})
		case w.namespaces == nil || w.namespaces[e.lease.Namespace]:
			out = append(out, Event{Revision: formatRevision(c.epoch, e.n), Lease: e.lease})
		}
	}
	if w.cursor < c.head {
		return out, closed
	}
	return out, c.grown
}

// closed is a channel that is always closed.
var closed = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Revision is the watcher's position: a watch resumed from it misses
// nothing this watcher has not handed on.
func (w *Watcher) Revision() string {
	return formatRevision(w.log.epoch, w.cursor)
}
