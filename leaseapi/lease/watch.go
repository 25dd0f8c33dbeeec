package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// MaxWait bounds one WaitForChange.
const MaxWait = time.Minute

// changes wakes the waiters of a key when this process writes it, and, with
// a store's LeaseFeed (FollowFeed), when another replica does.
type changes struct {
	mu      sync.Mutex
	waiters map[leaseapi.Key]chan struct{}
}

// next returns a channel closed at the next write of key.
func (c *changes) next(key leaseapi.Key) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiters == nil {
		c.waiters = map[leaseapi.Key]chan struct{}{}
	}
	ch, ok := c.waiters[key]
	if !ok {
		ch = make(chan struct{})
		c.waiters[key] = ch
	}
	return ch
}

func (c *changes) notify(key leaseapi.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.waiters[key]; ok {
		close(ch)
		delete(c.waiters, key)
	}
}

// notifyAll wakes every waiter: each reads its lease again.
func (c *changes) notifyAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, ch := range c.waiters {
		close(ch)
		delete(c.waiters, key)
	}
}

// feedRetry is the pause before a broken LeaseFeed is followed again.
const feedRetry = time.Second

// FollowFeed wakes this server's long polls at lease writes made through
// any server sharing the store, as feed reports them, until ctx ends. A
// broken feed is reported to onBreak and followed again after a pause;
// until it follows, waiters still learn of this server's own writes and of
// expiries, and their clients poll as well.
//
// The changes it reports reach watches too: a reported key is read (in a
// goroutine of its own, since the feed must not block) and logged as a
// change when its state is new to this server; a (re)start of the feed is
// logged as a reset.
func (s *Service) FollowFeed(ctx context.Context, feed store.LeaseFeed, onBreak func(error)) {
	fed := newFedKeys(maxFedKeys)
	go s.readFed(ctx, fed)
	changed := func(c store.LeaseChange) {
		if c.All {
			s.changes.notifyAll()
			s.changeLog.reset(ResetFeed)
			return
		}
		key := leaseapi.Key{Namespace: c.Namespace, Name: c.Name}
		s.changes.notify(key)
		fed.add(key)
	}
	for {
		err := feed.FollowLeases(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the feed ended")
		}
		onBreak(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(feedRetry):
		}
	}
}

// WaitForChange returns the lease as Get shows it as soon as its holder or
// token differ from the ones given, waiting up to wait (at most MaxWait) for
// that: a release, an expiry or a new term. A waiting cluster uses it to take
// over a released lease at once instead of at its next poll. A lease that is
// free but reserved when the wait begins is also answered when that
// reservation ends, since a cluster it held back may then take it. A key
// never seen answers store.ErrNotFound once the wait ends.
func (s *Service) WaitForChange(ctx context.Context, key leaseapi.Key, holder string, token int32, wait time.Duration) (store.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, min(wait, MaxWait))
	defer cancel()
	var reserved store.Reservation // as the wait began
	for first := true; ; first = false {
		changed := s.changes.next(key)
		l, err := s.Get(ctx, key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.Lease{}, err
		}
		found := err == nil
		if first {
			reserved = l.Reserved
		}
		if found && (l.Holder != holder || l.FencingToken != token || l.Reserved != reserved) {
			return l, nil
		}
		// Nothing changed yet: sleep until a write, the holder's expiry, the
		// reservation's end, or the end of the wait.
		var expiry <-chan time.Time
		var timer *time.Timer
		if until := wakeAt(l); found && !until.IsZero() {
			at, err := s.now(ctx)
			if err != nil {
				return store.Lease{}, err
			}
			timer = time.NewTimer(until.Sub(at.earliest) + time.Millisecond)
			expiry = timer.C
		}
		select {
		case <-changed:
		case <-expiry:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			if !found {
				return store.Lease{}, err
			}
			return l, nil
		}
	}
}

// wakeAt is when a lease as Get shows it changes with no write: its
// holder's expiry, or the end of its reservation; zero if never.
func wakeAt(l store.Lease) time.Time {
	if l.Holder != "" {
		return l.ExpiresAt
	}
	return l.Reserved.Until
}

// maxFedKeys bounds the keys a feed has reported and this server has not
// read yet; past it they are dropped for a reset.
const maxFedKeys = 1 << 16

// fedKeys are the keys a feed reported, to be read: a set, so that a key
// reported many times before it is read is read once.
type fedKeys struct {
	max int

	mu       sync.Mutex
	keys     map[leaseapi.Key]struct{}
	overflow bool
	ready    chan struct{} // holds a token while there is something to take
}

func newFedKeys(maxKeys int) *fedKeys {
	return &fedKeys{max: maxKeys, keys: map[leaseapi.Key]struct{}{}, ready: make(chan struct{}, 1)}
}

// add notes a reported key; it never blocks.
func (f *fedKeys) add(key leaseapi.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) >= f.max {
		f.keys = map[leaseapi.Key]struct{}{}
		f.overflow = true
	} else {
		f.keys[key] = struct{}{}
	}
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// take returns the keys noted so far, and whether some were dropped.
func (f *fedKeys) take() (map[leaseapi.Key]struct{}, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys, overflow := f.keys, f.overflow
	f.keys, f.overflow = map[leaseapi.Key]struct{}{}, false
	return keys, overflow
}

// readFed reads the keys a feed reports and logs their new states, until
// ctx ends. A key it could not read, or keys dropped, are logged as a reset:
// a watcher must then re-read what it cares about.
func (s *Service) readFed(ctx context.Context, fed *fedKeys) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-fed.ready:
		}
		keys, overflow := fed.take()
		missed := overflow
		for key := range keys {
			l, err := s.Get(ctx, key)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				missed = true
			default:
				s.changeLog.add(l)
			}
		}
		if missed && ctx.Err() == nil {
			s.changeLog.reset(ResetFeed)
		}
	}
}
