package lease

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi/store"
)

func TestStartOf(t *testing.T) {
	const epoch, size = "3f9a1c", 100
	cases := map[string]struct {
		revision   string
		head       uint64
		wantCursor uint64
		wantReset  ResetCause
	}{
		"no revision":                    {revision: "", head: 7, wantCursor: 7, wantReset: ResetStart},
		"no revision, empty log":         {revision: "", head: 0, wantCursor: 0, wantReset: ResetStart},
		"this epoch, at head":            {revision: "3f9a1c-7", head: 7, wantCursor: 7},
		"this epoch, behind":             {revision: "3f9a1c-3", head: 7, wantCursor: 3},
		"this epoch, from the beginning": {revision: "3f9a1c-0", head: 100, wantCursor: 0},
		"the oldest still kept":          {revision: "3f9a1c-50", head: 150, wantCursor: 50},
		"one change no longer kept":      {revision: "3f9a1c-49", head: 150, wantCursor: 150, wantReset: ResetTooOld},
		"another process":                {revision: "77aa00-3", head: 7, wantCursor: 7, wantReset: ResetUnknownRevision},
		"ahead of this process":          {revision: "3f9a1c-8", head: 7, wantCursor: 7, wantReset: ResetUnknownRevision},
		"no number":                      {revision: "3f9a1c-", head: 7, wantCursor: 7, wantReset: ResetUnknownRevision},
		"negative":                       {revision: "3f9a1c--1", head: 7, wantCursor: 7, wantReset: ResetUnknownRevision},
		"not a revision":                 {revision: "latest", head: 7, wantCursor: 7, wantReset: ResetUnknownRevision},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cursor, reset := startOf(tc.revision, epoch, tc.head, size)
			if cursor != tc.wantCursor || reset != tc.wantReset {
				t.Errorf("startOf(%q) = %d, %q; want %d, %q", tc.revision, cursor, reset, tc.wantCursor, tc.wantReset)
			}
		})
	}
}

func TestNewer(t *testing.T) {
	held := store.Lease{Holder: "east", FencingToken: 3}
	revoked := store.Lease{Holder: "east", FencingToken: 3, Revoked: true}
	free := store.Lease{FencingToken: 3}
	next := store.Lease{Holder: "west", FencingToken: 4}
	// The history of one key, in order: each state is newer than every
	// earlier one and than itself never.
	history := []store.Lease{{}, held, revoked, free, next}
	for i, a := range history {
		for j, b := range history {
			if got, want := newer(a, b), i > j; got != want {
				t.Errorf("newer(%+v, %+v) = %t, want %t", a, b, got, want)
			}
		}
	}
}

func TestChanged(t *testing.T) {
	held := store.Lease{Holder: "east", FencingToken: 3, ExpiresAt: t0}
	cases := map[string]struct {
		next store.Lease
		want bool
	}{
		"renewal":    {next: store.Lease{Holder: "east", FencingToken: 3, ExpiresAt: t0.Add(ttl)}, want: false},
		"release":    {next: store.Lease{FencingToken: 3, ExpiresAt: t0}, want: true},
		"revocation": {next: store.Lease{Holder: "east", FencingToken: 3, ExpiresAt: t0, Revoked: true}, want: true},
		"new term":   {next: store.Lease{Holder: "west", FencingToken: 4, ExpiresAt: t0.Add(ttl)}, want: true},
		"own term":   {next: store.Lease{Holder: "east", FencingToken: 4, ExpiresAt: t0.Add(ttl)}, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := changed(held, tc.next); got != tc.want {
				t.Errorf("changed = %t, want %t", got, tc.want)
			}
		})
	}
}

// entry is a record of key ns/name with a token, held by holder ("" free).
func entry(ns, name, holder string, token int32) store.Lease {
	return store.Lease{Namespace: ns, Name: name, Holder: holder, FencingToken: token}
}

// summary is what a test compares of an event: "RESET(cause)@n" or
// "ns/name holder#token@n".
func summary(epoch string, events []Event) []string {
	var out []string
	for _, e := range events {
		n, _ := parseRevision(e.Revision, epoch)
		if e.Reset != "" {
			out = append(out, fmt.Sprintf("RESET(%s)@%d", e.Reset, n))
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s %s#%d@%d", e.Lease.Namespace, e.Lease.Name, e.Lease.Holder, e.Lease.FencingToken, n))
	}
	return out
}

// TestWatcher drives a change log of four entries and watchers on it: a new
// watcher starts with a reset, a resumed one replays in order without one,
// one that falls out of the ring gets a reset instead of what it missed,
// stale and repeated states are not logged, namespaces filter, and a feed's
// reset reaches every watcher.
func TestWatcher(t *testing.T) {
	s := &Service{changeLog: newChangeLog(4)}
	c := s.changeLog
	read := func(w *Watcher, max int) []string {
		events, _ := w.Next(max)
		return summary(c.epoch, events)
	}
	check := func(what string, got, want []string) {
		t.Helper()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", what, diff)
		}
	}

	fresh := s.Watch(nil, "")
	check("a new watch", read(fresh, 10), []string{"RESET(start)@0"})
	check("nothing more", read(fresh, 10), nil)

	c.add(entry("a", "x", "east", 1))
	c.add(entry("a", "x", "east", 1)) // the feed reports our own write: not again
	c.add(entry("b", "y", "west", 1))
	c.add(entry("a", "x", "", 1))
	c.add(entry("a", "x", "east", 1)) // a stale write appended late: not logged
	check("changes in order", read(fresh, 10), []string{"a/x east#1@1", "b/y west#1@2", "a/x #1@3"})

	resumed := s.Watch(nil, formatRevision(c.epoch, 1))
	check("resumed after 1, two at a time", read(resumed, 2), []string{"b/y west#1@2", "a/x #1@3"})
	onlyA := s.Watch([]string{"a"}, formatRevision(c.epoch, 0))
	check("namespace a from the start", read(onlyA, 10), []string{"a/x east#1@1", "a/x #1@3"})
	check("another process's revision", read(s.Watch(nil, "0000-2"), 10), []string{"RESET(unknown-revision)@3"})

	// Four more changes: the ring holds 4..7, so revision 2 is too old, 3
	// is the oldest that resumes, and a watcher at 3 that reads nothing
	// until 8 arrives falls behind.
	slow := s.Watch(nil, formatRevision(c.epoch, 3))
	for i := range 4 {
		c.add(entry("c", "z", "east", int32(i+1)))
	}
	check("revision 2", read(s.Watch(nil, formatRevision(c.epoch, 2)), 10), []string{"RESET(too-old)@7"})
	c.add(entry("c", "z", "", 4))
	check("a watcher that fell behind", read(slow, 10), []string{"RESET(behind)@8"})
	check("and then keeps up", read(slow, 10), nil)

	c.reset(ResetFeed)
	check("a feed's reset", read(slow, 10), []string{"RESET(feed)@9"})
	check("a feed's reset, filtered watch", read(onlyA, 10), []string{"RESET(behind)@9"})
	if got := resumed.Revision(); got != formatRevision(c.epoch, 3) {
		t.Errorf("revision of a watcher that read up to 3: %s", got)
	}
}

// TestWatcherWakes: the channel Next returns is closed at once while
// events are left, else when the log grows.
func TestWatcherWakes(t *testing.T) {
	s := &Service{changeLog: newChangeLog(16)}
	w := s.Watch(nil, "")
	c := s.changeLog
	c.add(entry("a", "x", "east", 1))
	c.add(entry("a", "y", "east", 1))
	if _, more := w.Next(2); !isClosed(more) {
		t.Fatal("after a reset and one of two changes: the channel is not closed")
	}
	if events, more := w.Next(2); len(events) != 1 || isClosed(more) {
		t.Fatalf("the last change: %d events, channel closed %t", len(events), isClosed(more))
	} else {
		c.add(entry("a", "z", "east", 1))
		if !isClosed(more) {
			t.Fatal("the log grew: the channel is not closed")
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
