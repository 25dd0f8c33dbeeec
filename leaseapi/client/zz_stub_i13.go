package client

// TEMPORARY stubs of the i13-batch and i13-watch branches; removed at merge.

import (
	"context"
	"errors"
	"time"

	"github.com/berthfleet/berth/leaseapi"
)

var ErrNotSupported = errors.New("not supported")

type Renewal struct {
	Namespace, Name string
	FencingToken    int32
	TTL             time.Duration
}

func (c *Client) RenewBatch(ctx context.Context, holder string, renewals []Renewal) ([]AcquireResult, error) {
	return nil, ErrNotSupported
}

type LeaseEvent struct {
	Reset bool
	Lease leaseapi.Lease
}

func (c *Client) WatchLeases(ctx context.Context, namespaces []string, handle func(LeaseEvent), connected func(bool)) error {
	return ErrNotSupported
}
