package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/berthfleet/berth/leaseapi/client"
)

// Exit codes a script can rely on. They are listed in `berthctl --help` and
// docs/operations.md; change them only together.
const (
	exitOK           = 0
	exitError        = 1 // the server could not be reached or failed
	exitUsage        = 2 // bad arguments, flags or configuration; a request the server called invalid
	exitNotFound     = 3 // the lease or cluster does not exist
	exitConflict     = 4 // the server refused a write that raced another (e.g. a release)
	exitUnauthorized = 5 // no or bad credentials, or not allowed to do this
	exitNotDone      = 6 // a --wait ended without the outcome asked for
)

const exitCodesHelp = `Exit codes:
  0  success
  1  the server could not be reached or answered with a server error
  2  usage error: bad arguments, flags or configuration, or a request the server called invalid
  3  not found: the lease or cluster does not exist
  4  conflict: the server refused a write that raced another (a release or move of a lease that
     changed hands, a move elsewhere of a term already moving, a move to a cordoned cluster)
  5  unauthorized or forbidden: no or bad credentials, or not an administrator
  6  not done: a --wait ended otherwise than asked (another cluster took the lease, or --timeout
     passed)`

// usageError is a mistake in the command line or configuration: berthctl did
// not (or could not usefully) ask the server.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// notDoneError is a --wait that ended without the outcome asked for.
type notDoneError struct{ err error }

func (e *notDoneError) Error() string { return e.err.Error() }
func (e *notDoneError) Unwrap() error { return e.err }

// exitCode maps an error returned by run to the process's exit code.
func exitCode(err error) int {
	var (
		usage   *usageError
		notDone *notDoneError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &notDone):
		return exitNotDone
	case errors.As(err, &usage), errors.Is(err, client.ErrInvalid):
		return exitUsage
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrConflict):
		return exitConflict
	case errors.Is(err, client.ErrUnauthorized), errors.Is(err, client.ErrForbidden):
		return exitUnauthorized
	}
	return exitError
}

// oneLine flattens an error message so that it stays one line on stderr.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
