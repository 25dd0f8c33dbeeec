package server

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/berthfleet/berth/leaseapi"
)

// confirm answers GET .../leases/{name}/confirmation?holder=&fencingToken=:
// whether holder holds the lease now with that token, and how long the term
// has left at least (lease.DecideConfirmation). berth-fence asks it from
// inside a managed Pod with the Pod's service account token; the holder's
// owner and administrators may ask it too.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request, p Principal) error {
	key, holder, token, err := confirmationQuery(r)
	if err != nil {
		return err
	}
	if !p.mayConfirm(key, holder) {
		return forbiddenHolder(p, holder)
	}
	c, err := s.Service.Confirm(r.Context(), key, holder, token)
	if err != nil {
		return err
	}
	s.Metrics.observeConfirmation(c)
	// A confirmation is true as of its answer only: a cache that served it
	// later would stretch a fence's deadline past the term.
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, c)
	return nil
}

// confirmationQuery reads a confirmation's lease key, holder and fencing
// token, naming every field that is wrong.
func confirmationQuery(r *http.Request) (leaseapi.Key, string, int32, error) {
	key, keyErr := keyOf(r)
	q := r.URL.Query()
	holder := q.Get("holder")
	holderErr := leaseapi.ValidateHolder(holder)
	token, err := strconv.ParseInt(q.Get("fencingToken"), 10, 32)
	var tokenErr error
	if err != nil || token < 1 {
		tokenErr = &leaseapi.FieldError{Field: "fencingToken", Reason: fmt.Sprintf("must be an integer between 1 and %d", math.MaxInt32)}
	}
	return key, holder, int32(token), errors.Join(keyErr, holderErr, tokenErr)
}

// confirmationScope is what a service account token must be verified for
// to read a confirmation: the lease of the path, signed by the keys of the
// holder's cluster.
func confirmationScope(r *http.Request) (string, leaseapi.Key, error) {
	key, holder, _, err := confirmationQuery(r)
	return leaseapi.HolderCluster(holder), key, err
}
