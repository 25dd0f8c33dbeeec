package sqlite_test

import (
	"database/sql"
	"errors"
	"fmt"
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
		AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(30 * time.Second), Revoked: true,
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

// TestUpgradeFromVersion1 opens a database written by a binary that knew
// only schema version 1 (no revoked column): its leases load unrevoked and
// can be revoked and written again.
func TestUpgradeFromVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE leases (namespace TEXT NOT NULL, name TEXT NOT NULL, holder TEXT NOT NULL, fencing_token INTEGER NOT NULL,
			ttl_micros INTEGER NOT NULL, acquired_at INTEGER NOT NULL, renewed_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
			version INTEGER NOT NULL, PRIMARY KEY (namespace, name)) WITHOUT ROWID`,
		`CREATE TABLE clusters (id TEXT NOT NULL PRIMARY KEY, fingerprint TEXT NOT NULL, agent_version TEXT NOT NULL, labels TEXT NOT NULL,
			cordoned INTEGER NOT NULL, registered_at INTEGER NOT NULL, last_seen INTEGER NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID`,
		`INSERT INTO leases VALUES ('ns', 'a', 'east', 4, 30000000, 1767323045000000, 1767323045000000, 1767323075000000, 9)`,
		`PRAGMA user_version = 1`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open a version 1 database: %v", err)
	}
	defer func() { _ = s.Close() }()
	l, err := s.GetLease(t.Context(), "ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	if l.Holder != "east" || l.FencingToken != 4 || l.Revoked || l.Version != 9 {
		t.Fatalf("lease of a version 1 database: %+v, want east's unrevoked term 4 at version 9", l)
	}
	l.Revoked = true
	if l, err = s.PutLease(t.Context(), l); err != nil || !l.Revoked {
		t.Fatalf("revoke after the upgrade: %+v, %v", l, err)
	}
}

// TestBatchSurvivesReopen: a batch written in statements of many rows is on
// disk as the store answered it.
func TestBatchSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	leases := make([]store.Lease, 150)
	keys := make([]store.LeaseKey, len(leases))
	for i := range leases {
		leases[i] = store.Lease{Namespace: "ns", Name: fmt.Sprintf("l-%03d", i), Holder: "east", FencingToken: int32(i + 1),
			TTL: time.Minute, AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(time.Minute), Revoked: i%2 == 0}
		keys[i] = store.LeaseKey{Namespace: "ns", Name: leases[i].Name}
	}
	want, errs, err := s.PutLeases(t.Context(), leases)
	if err != nil || errors.Join(errs...) != nil {
		t.Fatalf("write: %v %v", err, errors.Join(errs...))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	got, err := s.GetLeases(t.Context(), keys)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after reopen (-written +read):\n%s", diff)
	}
}
