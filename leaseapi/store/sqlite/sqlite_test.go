package sqlite_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "leases.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.Open(t.Context(), path); !errors.Is(err, sqlite.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	_ = s.Close()
}

func TestRecordsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	want, err := s.PutLease(t.Context(), store.Lease{
		Namespace: "ns", Name: "a", Holder: "east", FencingToken: 7, TTL: 30 * time.Second,
		AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(30 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	wantC, err := s.PutCluster(t.Context(), store.Cluster{ID: "east", Fingerprint: "uid", Labels: map[string]string{"a": "b"}, Cordoned: true, RegisteredAt: now, LastSeen: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	got, err := s.GetLease(t.Context(), "ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lease after reopen (-want +got):\n%s", diff)
	}
	gotC, err := s.GetCluster(t.Context(), "east")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantC, gotC); diff != "" {
		t.Errorf("cluster after reopen (-want +got):\n%s", diff)
	}
}
