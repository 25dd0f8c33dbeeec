package server

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// List page sizes.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, p Principal) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	var req leaseapi.AcquireRequest
	if err := decodeValid(r, &req); err != nil {
		return err
	}
	if !p.mayHold(req.Holder) {
		return forbiddenHolder(p, req.Holder)
	}
	d, err := s.Service.Acquire(r.Context(), key, req.Holder, seconds(req.TTLSeconds))
	if err != nil {
		return err
	}
	s.Metrics.observeDecision(d)
	writeJSON(w, http.StatusOK, acquireResponse(d))
	return nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, p Principal) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	var req leaseapi.RenewRequest
	if err := decodeValid(r, &req); err != nil {
		return err
	}
	if !p.mayHold(req.Holder) {
		return forbiddenHolder(p, req.Holder)
	}
	d, err := s.Service.Renew(r.Context(), key, req.Holder, req.FencingToken, seconds(req.TTLSeconds))
	if err != nil {
		return err
	}
	s.Metrics.observeDecision(d)
	writeJSON(w, http.StatusOK, acquireResponse(d))
	return nil
}

// renewBatch renews many leases of one holder in one request (POST
// /v1alpha1/renewals): each exactly as renew decides it, at one reading of
// the clock. A store failure fails the whole batch (500), although some
// renewals may have landed: they only extend the caller's own terms, and
// the caller counts every lease of the batch as not renewed.
func (s *Server) renewBatch(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req leaseapi.BatchRenewRequest
	if err := leaseapi.DecodeLimited(r.Body, &req, leaseapi.MaxBatchBodyBytes); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if !p.mayHold(req.Holder) {
		return forbiddenHolder(p, req.Holder)
	}
	if rec, ok := w.(*recorder); ok {
		rec.leases = len(req.Leases)
	}
	s.Metrics.batchLeases.Observe(float64(len(req.Leases)))
	renewals := make([]lease.Renewal, len(req.Leases))
	for i, l := range req.Leases {
		renewals[i] = lease.Renewal{Key: leaseapi.Key{Namespace: l.Namespace, Name: l.Name}, Token: l.FencingToken, TTL: seconds(l.TTLSeconds)}
	}
	decisions, err := s.Service.RenewBatch(r.Context(), req.Holder, renewals)
	if err != nil {
		return err
	}
	out := leaseapi.BatchRenewResponse{Items: make([]leaseapi.BatchRenewResult, len(decisions))}
	for i, d := range decisions {
		s.Metrics.observeDecision(d)
		out.Items[i] = leaseapi.BatchRenewResult{Namespace: req.Leases[i].Namespace, Name: req.Leases[i].Name, AcquireResponse: acquireResponse(d)}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// release ends the caller's own term: the holder's statement that its
// workload has stopped. An administrator's release of another subject's
// live term revokes it instead, since only the holder knows when its
// workload has stopped.
func (s *Server) release(w http.ResponseWriter, r *http.Request, p Principal) error {
	return s.endTerm(w, r, p, false)
}

// revoke asks the holder of a live term to hand it over: the term is marked
// revoked and moves once its holder has stopped and released it, or at its
// end (lease.DecideRevoke). Unlike a release, it never frees a term whose
// holder may still run, whoever asks: the holder's own subject, or an
// administrator. berthctl's release uses it.
func (s *Server) revoke(w http.ResponseWriter, r *http.Request, p Principal) error {
	return s.endTerm(w, r, p, true)
}

// endTerm is release and revoke: the holder's own release frees its term,
// anything else the caller may do revokes it.
func (s *Server) endTerm(w http.ResponseWriter, r *http.Request, p Principal, revoke bool) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	var req leaseapi.ReleaseRequest
	if err := decodeValid(r, &req); err != nil {
		return err
	}
	owner := p.mayHold(req.Holder)
	if !owner && !p.Admin {
		return forbiddenHolder(p, req.Holder)
	}
	var d lease.Decision
	if revoke || !owner {
		d, err = s.Service.Revoke(r.Context(), key, req.Holder, req.FencingToken)
	} else {
		d, err = s.Service.Release(r.Context(), key, req.Holder, req.FencingToken)
	}
	if err != nil {
		return err
	}
	s.Metrics.observeDecision(d)
	if d.Outcome == lease.OutcomeRevoked && d.Write {
		s.Log.Info("lease revoked", "lease", key.String(), "holder", req.Holder, "token", req.FencingToken, "expiresAt", d.Next.ExpiresAt, "subject", p.Subject)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// move asks the holder of a live term to hand it over to another cluster
// (lease.DecideMove): the term is revoked, so that its holder stops and
// releases it as for a revocation, and when it ends the lease is reserved
// for the destination. An administrator or the holder's own subject may
// ask (the holder's agent moves its own term to fail back). The answer is
// the lease as it is after the move.
func (s *Server) move(w http.ResponseWriter, r *http.Request, p Principal) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	var req leaseapi.MoveRequest
	if err := decodeValid(r, &req); err != nil {
		return err
	}
	if !p.mayHold(req.Holder) && !p.Admin {
		return forbiddenHolder(p, req.Holder)
	}
	d, err := s.Service.Move(r.Context(), key, req.Holder, req.FencingToken, req.To)
	if err != nil {
		return err
	}
	s.Metrics.observeDecision(d)
	if d.Outcome == lease.OutcomeMoved && d.Write {
		s.Log.Info("lease moved", "lease", key.String(), "holder", req.Holder, "token", req.FencingToken, "to", req.To,
			"expiresAt", d.Next.ExpiresAt, "subject", p.Subject)
	}
	writeJSON(w, http.StatusOK, wireLease(d.Next))
	return nil
}

// Bounds of a history read.
const (
	defaultHistoryLimit = 100
	maxHistoryLimit     = 1000
)

// history answers the terms of a lease, newest first, the live one first.
func (s *Server) history(w http.ResponseWriter, r *http.Request, _ Principal) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	limit := defaultHistoryLimit
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxHistoryLimit {
			return &leaseapi.FieldError{Field: "limit", Reason: fmt.Sprintf("must be an integer between 1 and %d", maxHistoryLimit)}
		}
		limit = n
	}
	entries, err := s.Service.History(r.Context(), key, limit)
	if err != nil {
		return err
	}
	out := leaseapi.TermList{Items: make([]leaseapi.Term, 0, len(entries))}
	for _, e := range entries {
		out.Items = append(out.Items, leaseapi.Term{Holder: e.Holder, FencingToken: e.FencingToken,
			AcquiredAt: e.AcquiredAt, EndedAt: e.EndedAt, Ending: string(e.Ending)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request, _ Principal) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	var l store.Lease
	if q := r.URL.Query(); q.Has("waitSeconds") {
		wait, holder, token, werr := waitOptions(q)
		if werr != nil {
			return werr
		}
		l, err = s.Service.WaitForChange(r.Context(), key, holder, token, wait)
	} else {
		l, err = s.Service.Get(r.Context(), key)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wireLease(l))
	return nil
}

// waitOptions reads a long poll: answer once the lease's holder or token
// differ from holder and fencingToken, or after waitSeconds.
func waitOptions(q url.Values) (time.Duration, string, int32, error) {
	wait, err := strconv.Atoi(q.Get("waitSeconds"))
	if err != nil || wait < 1 || time.Duration(wait)*time.Second > lease.MaxWait {
		return 0, "", 0, &leaseapi.FieldError{Field: "waitSeconds", Reason: fmt.Sprintf("must be an integer between 1 and %d", int(lease.MaxWait/time.Second))}
	}
	var token int64
	if t := q.Get("fencingToken"); t != "" {
		if token, err = strconv.ParseInt(t, 10, 32); err != nil || token < 0 {
			return 0, "", 0, &leaseapi.FieldError{Field: "fencingToken", Reason: "must be a non-negative integer"}
		}
	}
	return time.Duration(wait) * time.Second, q.Get("holder"), int32(token), nil
}

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request, _ Principal) error {
	opts, err := listOptions(r)
	if err != nil {
		return err
	}
	leases, more, err := s.Service.List(r.Context(), opts)
	if err != nil {
		return err
	}
	out := leaseapi.LeaseList{Items: make([]leaseapi.Lease, 0, len(leases))}
	for _, l := range leases {
		out.Items = append(out.Items, wireLease(l))
	}
	if more && len(leases) > 0 {
		last := leases[len(leases)-1]
		out.Continue = base64.RawURLEncoding.EncodeToString([]byte(leaseapi.Key{Namespace: last.Namespace, Name: last.Name}.String()))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) registerCluster(w http.ResponseWriter, r *http.Request, p Principal) error {
	id := r.PathValue("id")
	if err := leaseapi.ValidateClusterID(id); err != nil {
		return err
	}
	var req leaseapi.ClusterRegistration
	if err := decodeValid(r, &req); err != nil {
		return err
	}
	if !p.mayHold(id) {
		return fmt.Errorf("%w: subject %q may not register cluster %q", errForbidden, p.Subject, id)
	}
	c, err := s.Service.RegisterCluster(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, leaseapi.ClusterRegistrationResponse{ID: c.ID, Cordoned: c.Cordoned, LastSeen: c.LastSeen})
	return nil
}

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request, _ Principal) error {
	statuses, err := s.Service.Clusters(r.Context())
	if err != nil {
		return err
	}
	out := leaseapi.ClusterList{Items: make([]leaseapi.Cluster, 0, len(statuses))}
	for _, c := range statuses {
		out.Items = append(out.Items, leaseapi.Cluster{
			ID: c.ID, Fingerprint: c.Fingerprint, AgentVersion: c.AgentVersion, Labels: c.Labels,
			LastSeen: c.LastSeen, Healthy: c.Healthy, Cordoned: c.Cordoned, LeasesHeld: c.LeasesHeld,
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) cordon(cordoned bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		id := r.PathValue("id")
		if err := leaseapi.ValidateClusterID(id); err != nil {
			return err
		}
		if !p.Admin {
			return fmt.Errorf("%w: subject %q is not an administrator", errForbidden, p.Subject)
		}
		c, err := s.Service.SetCordoned(r.Context(), id, cordoned)
		if err != nil {
			return err
		}
		s.Log.Info("cluster cordon changed", "cluster", id, "cordoned", c.Cordoned, "subject", p.Subject)
		writeJSON(w, http.StatusOK, leaseapi.ClusterRegistrationResponse{ID: c.ID, Cordoned: c.Cordoned, LastSeen: c.LastSeen})
		return nil
	}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request, _ Principal) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request, _ Principal) error {
	if err := s.Store.Ping(r.Context()); err != nil {
		s.Log.Error(err, "readiness probe failed")
		writeJSON(w, http.StatusServiceUnavailable, leaseapi.Error{Error: "store unavailable"})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func keyOf(r *http.Request) (leaseapi.Key, error) {
	k := leaseapi.Key{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	return k, k.Validate()
}

// validator is a request body that checks itself.
type validator interface{ Validate() error }

func decodeValid(r *http.Request, v validator) error {
	if err := leaseapi.Decode(r.Body, v); err != nil {
		return err
	}
	return v.Validate()
}

func listOptions(r *http.Request) (store.ListOptions, error) {
	q := r.URL.Query()
	opts := store.ListOptions{Namespace: q.Get("namespace"), Limit: defaultListLimit}
	if opts.Namespace != "" {
		if err := (leaseapi.Key{Namespace: opts.Namespace, Name: "x"}).Validate(); err != nil {
			return opts, err
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			return opts, &leaseapi.FieldError{Field: "limit", Reason: fmt.Sprintf("must be an integer between 1 and %d", maxListLimit)}
		}
		opts.Limit = n
	}
	if c := q.Get("continue"); c != "" {
		raw, err := base64.RawURLEncoding.DecodeString(c)
		if err == nil {
			_, err = leaseapi.ParseKey(string(raw))
		}
		if err != nil {
			return opts, &leaseapi.FieldError{Field: "continue", Reason: "is not a token this server issued"}
		}
		opts.After = string(raw)
	}
	return opts, nil
}

func forbiddenHolder(p Principal, holder string) error {
	return fmt.Errorf("%w: subject %q may not act as holder %q (only %q or %q)", errForbidden, p.Subject, holder, p.Subject, p.Subject+"/...")
}

func seconds(n int32) time.Duration { return time.Duration(n) * time.Second }

func acquireResponse(d lease.Decision) leaseapi.AcquireResponse {
	l := d.Next
	res := leaseapi.AcquireResponse{
		Acquired: d.Held(), Holder: l.Holder, FencingToken: l.FencingToken,
		AcquiredAt: l.AcquiredAt, RenewedAt: l.RenewedAt, ExpiresAt: l.ExpiresAt, Revoked: l.Revoked,
		Move: wireMove(l), Reservation: wireReservation(l.Reserved),
	}
	if d.Outcome == lease.OutcomeHeldByOther && l.Holder == "" {
		res.Message = reservationMessage(l.Reserved)
	}
	return res
}

// reservationMessage says why a free lease was not granted.
func reservationMessage(r store.Reservation) string {
	until := r.Until.Format(time.RFC3339)
	if r.For != "" {
		return fmt.Sprintf("lease is reserved for cluster %s until %s (a move's destination)", r.For, until)
	}
	return fmt.Sprintf("lease is reserved for any cluster but %s until %s (a move away from it)", r.Except, until)
}

func wireLease(l store.Lease) leaseapi.Lease {
	return leaseapi.Lease{
		Namespace: l.Namespace, Name: l.Name, Holder: l.Holder, FencingToken: l.FencingToken,
		TTLSeconds: int32(l.TTL / time.Second), AcquiredAt: l.AcquiredAt, RenewedAt: l.RenewedAt, ExpiresAt: l.ExpiresAt,
		Revoked: l.Revoked, Move: wireMove(l), Reservation: wireReservation(l.Reserved),
	}
}

func wireMove(l store.Lease) *leaseapi.Move {
	if !l.Moving || l.Holder == "" {
		return nil
	}
	return &leaseapi.Move{From: leaseapi.HolderCluster(l.Holder), To: l.MoveTo}
}

func wireReservation(r store.Reservation) leaseapi.Reservation {
	return leaseapi.Reservation{ReservedFor: r.For, ReservedExcept: r.Except, ReservedUntil: r.Until}
}
