package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// Renewal is one lease of a batched renewal: the term of the lease Key held
// with Token, to be extended by TTL.
type Renewal struct {
	Key   leaseapi.Key
	Token int32
	TTL   time.Duration
}

// RenewBatch renews every lease of renewals for holder, each exactly as
// Renew decides it (DecideRenew), at one reading of the clock: every
// renewed term ends that instant plus its own TTL. decisions[i] answers
// renewals[i]; keys must be distinct.
//
// On a store that offers store.LeaseBatchStore it reads every lease in one
// round trip and writes every renewed one in another, each write a
// compare-and-swap on the version it read; a lease whose write lost a race
// is renewed again through the per-lease loop that Renew uses. On any other
// store it renews lease by lease. An error is a store failure: some of the
// renewals may have landed, which extends only the holder's own terms.
func (s *Service) RenewBatch(ctx context.Context, holder string, renewals []Renewal) ([]Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return nil, err
	}
	decide := func(r Renewal) func(store.Lease) (Decision, error) {
		return func(cur store.Lease) (Decision, error) {
			return at.grant(DecideRenew(cur, holder, r.Token, r.TTL, at.earliest)), nil
		}
	}
	decisions := make([]Decision, len(renewals))
	batch, ok := s.store.(store.LeaseBatchStore)
	if !ok {
		for i, r := range renewals {
			if decisions[i], err = s.updateLease(ctx, r.Key, decide(r)); err != nil {
				return nil, err
			}
		}
		return decisions, nil
	}

	keys := make([]store.LeaseKey, len(renewals))
	for i, r := range renewals {
		keys[i] = store.LeaseKey{Namespace: r.Key.Namespace, Name: r.Key.Name}
	}
	current, err := batch.GetLeases(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(renewals), err)
	}
	var (
		writes []store.Lease
		of     []int // of[j]: the renewal that writes[j] writes
	)
	for i, r := range renewals {
		decisions[i], _ = decide(r)(current[i])
		if decisions[i].Write {
			writes = append(writes, decisions[i].Next)
			of = append(of, i)
		}
	}
	if len(writes) == 0 {
		return decisions, nil
	}
	written, errs, err := batch.PutLeases(ctx, writes)
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(renewals), err)
	}
	for j, i := range of {
		r := renewals[i]
		switch {
		case errs[j] == nil:
			decisions[i].Next = written[j]
			s.changes.notify(r.Key)
		case errors.Is(errs[j], store.ErrConflict):
			// Another write landed since the read: decide again on what it left.
			if decisions[i], err = s.updateLease(ctx, r.Key, decide(r)); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("lease %s: %w", r.Key, errs[j])
		}
	}
	return decisions, nil
}
