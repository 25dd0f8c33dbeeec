package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"k8s.io/client-go/rest"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

// ClockMaxUncertainty is the widest reading of the API server's clock the
// store serves with. The API server shows its clock only in the HTTP Date
// header, to the whole second: one sample bounds it to a second and a round
// trip, and samples timed on its ticks (refclock) narrow that to about a
// round trip within some seconds.
const ClockMaxUncertainty = 2 * time.Second

var _ store.Clock = (*Store)(nil)

// apiServerClock reads the API server's clock from the Date header of GET
// /version, on a connection of its own, so that the store's requests never
// queue behind it nor it behind them.
type apiServerClock struct {
	client *http.Client
	url    string
}

func newAPIServerClock(cfg *rest.Config) (*apiServerClock, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes store clock client: %w", err)
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes store clock URL: %w", err)
	}
	return &apiServerClock{client: client, url: base.JoinPath("version").String()}, nil
}

// read implements refclock.ReadFunc. Any answer will do, even a refusal:
// the API server dates every answer when it writes the headers, rounding
// down to the second.
func (c *apiServerClock) read(ctx context.Context) (time.Time, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return time.Time{}, time.Time{}, fmt.Errorf("GET /version: %w", err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	date := resp.Header.Get("Date")
	t, err := http.ParseTime(date)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("the API server's answer to GET /version has no usable Date header (%q)", date)
	}
	return t, t.Add(time.Second), nil
}

// Now implements store.Clock: every replica on this API server judges lease
// terms by the API server's clock, sampled in the background and carried
// forward on the local monotonic clock.
func (s *Store) Now(ctx context.Context) (store.Reading, error) { return s.clock.Now(ctx) }

// Clock is the store's clock, for its metrics.
func (s *Store) Clock() *refclock.Clock { return s.clock }

// startClock samples the API server's clock until stopClock.
func (s *Store) startClock(cfg *rest.Config, opts refclock.Options) error {
	c, err := newAPIServerClock(cfg)
	if err != nil {
		return err
	}
	if opts.MaxUncertainty <= 0 {
		opts.MaxUncertainty = ClockMaxUncertainty
	}
	var stop func()
	s.clock, stop = refclock.Start(c.read, opts)
	s.stopClock = func() {
		stop()
		c.client.CloseIdleConnections()
	}
	return nil
}
