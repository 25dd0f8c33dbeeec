package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
)

// defaultChunkSize is the page size of `leases list`; the server allows up to
// maxChunkSize.
const (
	defaultChunkSize = 500
	maxChunkSize     = 1000
)

func newLeasesListCommand(o *globalOptions) *cobra.Command {
	var (
		opts   listOptions
		output outputFormat
	)
	cmd := &cobra.Command{
		Use:   "list [-n NAMESPACE] [--limit N]",
		Short: "List leases, following pages until all are listed or --limit is reached",
		Example: `  berthctl leases list
  berthctl leases list -n payments -o wide
  berthctl leases list --limit 50 -o json   # "continue" resumes with --continue`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.validate(); err != nil {
				return err
			}
			c, _, err := o.connect()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			list, err := listLeases(ctx, c, opts)
			if err != nil {
				return err
			}
			now := o.clock.Now()
			return printObject(o.out, output, list, func(wide bool) table { return leaseTable(list.Items, now, wide) })
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&opts.namespace, "namespace", "n", "", "list only this namespace (default: all)")
	fs.IntVar(&opts.limit, "limit", 0, "list at most N leases; the output's \"continue\" resumes after them (0: all)")
	fs.StringVar(&opts.continueToken, "continue", "", "resume a list limited by --limit from its \"continue\" token")
	fs.IntVar(&opts.chunkSize, "chunk-size", defaultChunkSize, fmt.Sprintf("leases asked for per request (1 to %d)", maxChunkSize))
	bindOutput(fs, &output)
	return cmd
}

// listOptions are the flags of `leases list`.
type listOptions struct {
	namespace     string
	limit         int
	continueToken string
	chunkSize     int
}

func (o listOptions) validate() error {
	if o.namespace != "" {
		// Any valid name stands in to check the namespace alone.
		if err := (leaseapi.Key{Namespace: o.namespace, Name: "x"}).Validate(); err != nil {
			return usageErrorf("--namespace: %w", err)
		}
	}
	if o.limit < 0 {
		return usageErrorf("--limit must be 0 (all) or positive, got %d", o.limit)
	}
	if o.chunkSize < 1 || o.chunkSize > maxChunkSize {
		return usageErrorf("--chunk-size must be between 1 and %d, got %d", maxChunkSize, o.chunkSize)
	}
	return nil
}

// leaseLister is the part of the client that `leases list` needs.
type leaseLister interface {
	ListLeases(ctx context.Context, opts client.ListOptions) (leaseapi.LeaseList, error)
}

var _ leaseLister = (*client.Client)(nil)

// listLeases follows "continue" until the list is complete or holds
// opts.limit items. The result's Continue is empty when nothing is left.
func listLeases(ctx context.Context, c leaseLister, opts listOptions) (leaseapi.LeaseList, error) {
	out := leaseapi.LeaseList{Items: []leaseapi.Lease{}}
	next := opts.continueToken
	for {
		page := opts.chunkSize
		if opts.limit > 0 {
			page = min(page, opts.limit-len(out.Items))
		}
		list, err := c.ListLeases(ctx, client.ListOptions{Namespace: opts.namespace, Limit: page, Continue: next})
		if err != nil {
			return leaseapi.LeaseList{}, err
		}
		out.Items = append(out.Items, list.Items...)
		if list.Continue != "" && (list.Continue == next || len(list.Items) == 0) {
			return leaseapi.LeaseList{}, fmt.Errorf("list leases: the server answered continue token %q without progress", list.Continue)
		}
		next = list.Continue
		if next == "" || (opts.limit > 0 && len(out.Items) >= opts.limit) {
			out.Continue = next
			return out, nil
		}
	}
}

func newLeasesGetCommand(o *globalOptions) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "get NAMESPACE/NAME",
		Short: "Show one lease: its holder, fencing token and expiry",
		Args:  exactArgs("NAMESPACE/NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			at, cancel, err := o.readLease(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer cancel()
			l, now := at.lease, o.clock.Now()
			return printObject(o.out, output, l, func(wide bool) table { return leaseTable([]leaseapi.Lease{l}, now, wide) })
		},
	}
	bindOutput(cmd.Flags(), &output)
	return cmd
}

func newLeasesReleaseCommand(o *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "release NAMESPACE/NAME",
		Short: "Ask a lease's holder to hand it over (administrators, or the holder's own subject)",
		Long: `Ask a lease's holder to hand it over, whoever holds it. Only subjects named by
the server's --admin-subjects may do so for another subject's holder.

berthctl reads the lease and revokes its current term, named by holder and
fencing token, so it never acts on a term that began after the read: if the
lease changed hands in between, the server refuses with a conflict (exit 4).
A free lease is left alone and the command succeeds.

The term is not freed at once, since its holder may still be running the
workload. The holder can no longer be told it holds the lease; its agent learns
so at its next renewal, stops its Pods (renewing the term until they are gone)
and then releases the lease, and another cluster takes over. If the holder's
agent is not running, the term ends at its expiry, never earlier.`,
		Args: exactArgs("NAMESPACE/NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			at, cancel, err := o.readLease(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer cancel()
			c, ctx, key, l := at.client, at.ctx, at.key, at.lease
			if l.Holder == "" {
				_, err := fmt.Fprintf(o.out, "lease %s is already free (fencing token %d)\n", key, l.FencingToken)
				return err
			}
			if err := c.Revoke(ctx, key.Namespace, key.Name, l.Holder, l.FencingToken); err != nil {
				if errors.Is(err, client.ErrConflict) {
					return fmt.Errorf("%w (the lease changed after it was read; look again with `berthctl leases get %s`)", err, key)
				}
				return err
			}
			// The answer is the same whether the term was revoked or had
			// ended meanwhile: the lease as it is now tells which.
			after, err := c.GetLease(ctx, key.Namespace, key.Name)
			if err != nil {
				return err
			}
			if after.Revoked && after.Holder == l.Holder && after.FencingToken == l.FencingToken {
				_, err = fmt.Fprintf(o.out, "lease %s revoked: the holder %s (fencing token %d) stops its Pods and hands over; if its agent does not, the term ends at %s\n",
					key, l.Holder, l.FencingToken, after.ExpiresAt.Format(time.RFC3339))
				return err
			}
			_, err = fmt.Fprintf(o.out, "lease %s released (was held by %s with fencing token %d)\n", key, l.Holder, l.FencingToken)
			return err
		},
	}
}

func newLeasesMoveCommand(o *globalOptions) *cobra.Command {
	var (
		to   string
		wait bool
	)
	cmd := &cobra.Command{
		Use:   "move NAMESPACE/NAME [--to CLUSTER]",
		Short: "Ask a lease's holder to hand it over to another cluster (administrators, or the holder's own subject)",
		Long: `Ask a lease's holder to hand it over, and keep the lease for the cluster named by
--to (or, without --to, for any cluster but the holder's) once it does: the safe
way to move one lease on purpose.

berthctl reads the lease and moves its current term, named by holder and fencing
token, so it never acts on a term that began after the read. The term is revoked,
not freed: its holder's agent stops its Pods (renewing the term until they are
gone) and then releases the lease. From that release (or the term's expiry, if
the agent does not release it) the lease is reserved for one TTL of the term (at
least 5 s): only the destination may acquire it, and the other clusters wait.
If the destination does not take it in that time, anyone may.

The destination must be registered and not cordoned. A term already moving keeps
its destination (moving it elsewhere is a conflict); a move without --to of a term
already moving changes nothing. A free lease is left alone and the command
succeeds.

With --wait, berthctl then follows the handover, printing a line each time it
advances, until a new term begins: it succeeds when the destination (without
--to, any other cluster) holds the lease, and exits 6 when another cluster took
it (the destination did not within its reservation: its BerthLease or agent is
missing, or it is unhealthy) or --timeout passed first. --timeout bounds the
whole command: give it the Pods' stop time plus twice the lease's TTL to see a
reservation run out.`,
		Example: `  berthctl leases move payments/exporter --to west
  berthctl leases move payments/exporter          # to any other cluster
  berthctl leases move payments/exporter --to west --wait --timeout 5m`,
		Args: exactArgs("NAMESPACE/NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to != "" {
				if err := leaseapi.ValidateClusterID(to); err != nil {
					return usageErrorf("--to: %w", err)
				}
			}
			at, cancel, err := o.readLease(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer cancel()
			c, ctx, key, l := at.client, at.ctx, at.key, at.lease
			if l.Holder == "" {
				_, err := fmt.Fprintf(o.out, "lease %s is free (fencing token %d): nothing to move\n", key, l.FencingToken)
				return err
			}
			after, err := c.Move(ctx, key.Namespace, key.Name, l.Holder, l.FencingToken, to)
			if err != nil {
				if errors.Is(err, client.ErrConflict) {
					return fmt.Errorf("%w (look again with `berthctl leases get %s`)", err, key)
				}
				return err
			}
			if _, err := fmt.Fprintln(o.out, moveMessage(key, l, after)); err != nil || !wait || !moving(l, after) {
				return err
			}
			return awaitHandover(ctx, o.out, c, key, after)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "cluster id to move the lease to (default: any cluster but the holder's)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the handover until a new term begins, within --timeout; exit 6 unless the destination took the lease")
	return cmd
}

// waitInterval is how often --wait reads the lease.
const waitInterval = 500 * time.Millisecond

// awaitHandover follows the handover of moved, the lease as the move
// answered it, until a later term begins, printing each stage once. It
// fails with a notDoneError when that term is not the destination's, or
// when ctx ends first.
func awaitHandover(ctx context.Context, out io.Writer, c *client.Client, key leaseapi.Key, moved leaseapi.Lease) error {
	began := time.Now()
	dest, from := moved.Move.To, leaseapi.HolderCluster(moved.Holder)
	var said handoverStage
	for {
		l, err := c.GetLease(ctx, key.Namespace, key.Name)
		switch {
		case ctx.Err() != nil:
			err := fmt.Errorf("lease %s: no new term within --timeout", key)
			if said.stage != "" {
				err = fmt.Errorf("%w; last seen: %s", err, said)
			}
			return &notDoneError{err}
		case err != nil:
			return err
		case l.FencingToken > moved.FencingToken && l.Holder != "":
			took := time.Since(began).Round(100 * time.Millisecond)
			if at := leaseapi.HolderCluster(l.Holder); at == from || (dest != "" && at != dest) {
				return &notDoneError{fmt.Errorf("lease %s: %s took it (fencing token %d) %s after the move, not %s: the reservation ran out first (is its BerthLease there, and its agent running?); see berthctl leases history %s",
					key, l.Holder, l.FencingToken, took, cmp.Or(dest, "another cluster"), key)}
			}
			_, err := fmt.Fprintf(out, "lease %s handed over: %s holds it with fencing token %d, %s after the move\n", key, l.Holder, l.FencingToken, took)
			return err
		}
		if now := stageOf(l, moved); now.stage != said.stage {
			if _, err := fmt.Fprintf(out, "waiting: %s\n", now); err != nil {
				return err
			}
			said = now
		}
		select {
		case <-ctx.Done():
		case <-time.After(waitInterval):
		}
	}
}

// handoverStage is where a handover stands: stage names it, detail adds
// what changes within it (a renewal moves the term's end).
type handoverStage struct{ stage, detail string }

func (s handoverStage) String() string { return s.stage + s.detail }

// stageOf says where the handover of moved stands, from the lease l.
func stageOf(l, moved leaseapi.Lease) handoverStage {
	switch {
	case l.Holder == moved.Holder && l.FencingToken == moved.FencingToken:
		return handoverStage{moved.Holder + " stops its Pods, then releases the lease", fmt.Sprintf(" (its term ends at %s at the latest)", l.ExpiresAt.Format(time.RFC3339))}
	case l.Holder == "" && l.ReservedFor != "":
		return handoverStage{fmt.Sprintf("%s gave the term up; the lease is reserved for %s", moved.Holder, l.ReservedFor), " until " + l.ReservedUntil.Format(time.RFC3339)}
	case l.Holder == "" && l.ReservedExcept != "":
		return handoverStage{fmt.Sprintf("%s gave the term up; the lease is reserved for any cluster but %s", moved.Holder, l.ReservedExcept), " until " + l.ReservedUntil.Format(time.RFC3339)}
	case l.Holder == "":
		return handoverStage{stage: "the lease is free, and no cluster has taken it yet"}
	}
	return handoverStage{stage: fmt.Sprintf("%s holds the lease with fencing token %d", l.Holder, l.FencingToken)}
}

// moving reports whether the move answered after is of the term l.
func moving(l, after leaseapi.Lease) bool {
	return after.Move != nil && after.Holder == l.Holder && after.FencingToken == l.FencingToken
}

// leaseAt is a lease as a command read it, with what it read it through.
type leaseAt struct {
	key    leaseapi.Key
	client *client.Client
	// ctx is bounded by --timeout; the caller's cancel ends it.
	ctx   context.Context
	lease leaseapi.Lease
}

// readLease reads the lease that arg ("NAMESPACE/NAME") names, for a command
// that shows it or acts on its current term; cancel when done.
func (o *globalOptions) readLease(ctx context.Context, arg string) (leaseAt, context.CancelFunc, error) {
	key, err := parseKey(arg)
	if err != nil {
		return leaseAt{}, nil, err
	}
	c, _, err := o.connect()
	if err != nil {
		return leaseAt{}, nil, err
	}
	ctx, cancel := o.withTimeout(ctx)
	l, err := c.GetLease(ctx, key.Namespace, key.Name)
	if err != nil {
		cancel()
		return leaseAt{}, nil, err
	}
	return leaseAt{key: key, client: c, ctx: ctx, lease: l}, cancel, nil
}

// moveMessage says what a move of term l did, from the lease after it.
func moveMessage(key leaseapi.Key, l, after leaseapi.Lease) string {
	if !moving(l, after) {
		// The term ended between the read and the move.
		return fmt.Sprintf("lease %s is no longer held by %s with fencing token %d: nothing to move", key, l.Holder, l.FencingToken)
	}
	dest := "cluster " + after.Move.To
	if after.Move.To == "" {
		dest = "any cluster but " + after.Move.From
	}
	reserve := max(time.Duration(after.TTLSeconds)*time.Second, 5*time.Second)
	return fmt.Sprintf("lease %s moving: the holder %s (fencing token %d) stops its Pods and releases the lease, which is then reserved for %s for %s; "+
		"if its agent does not release it, the term ends at %s and the reservation starts then",
		key, l.Holder, l.FencingToken, dest, reserve, after.ExpiresAt.Format(time.RFC3339))
}

func newLeasesHistoryCommand(o *globalOptions) *cobra.Command {
	var (
		limit  int
		output outputFormat
	)
	cmd := &cobra.Command{
		Use:   "history NAMESPACE/NAME [--limit N]",
		Short: "Show a lease's terms, newest first: who held it, when, and how each term ended",
		Long: `Show a lease's terms, newest first: the live term (if any), then the ended
terms the lease API keeps (its --history-terms, 20 by default). HOW is how a
term ended: released by its holder, expired, revoked (by an administrator or
its holder, then released or expired) or moved (berthctl leases move, or
POST .../move by the holder's own subject).`,
		Args: exactArgs("NAMESPACE/NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := parseKey(args[0])
			if err != nil {
				return err
			}
			if limit < 0 || limit > maxHistoryLimit {
				return usageErrorf("--limit must be between 0 (the server's default) and %d, got %d", maxHistoryLimit, limit)
			}
			c, _, err := o.connect()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			terms, err := c.History(ctx, key.Namespace, key.Name, limit)
			if err != nil {
				return err
			}
			list := leaseapi.TermList{Items: terms}
			now := o.clock.Now()
			return printObject(o.out, output, list, func(bool) table { return historyTable(terms, now) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, fmt.Sprintf("show at most N terms (0: the server's default, 100; at most %d)", maxHistoryLimit))
	bindOutput(cmd.Flags(), &output)
	return cmd
}

// maxHistoryLimit is the most terms the server answers at once.
const maxHistoryLimit = 1000

// parseKey parses a NAMESPACE/NAME argument; a bad key is a usage error.
func parseKey(s string) (leaseapi.Key, error) {
	k, err := leaseapi.ParseKey(s)
	if err != nil {
		return k, usageErrorf("lease %q: %w", s, err)
	}
	return k, nil
}
