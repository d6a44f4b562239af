// Package pgtest gives each test its own fresh Postgres database.
//
// NewDatabase creates a database with a random name through the admin connection
// (DATABASE_URL, or postgres://postgres@127.0.0.1:5432/test) and drops it, forcibly, when the
// test ends. If Postgres cannot be reached the test fails with instructions to start it: a
// missing database must never turn into a silently skipped test.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultURL is the admin database used when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test"

// AdminURL returns DATABASE_URL, or DefaultURL.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// NewDatabase creates an empty database for t and returns its DSN. The database is dropped
// WITH (FORCE) in t's cleanup, after cleanups registered later (such as closing a pool) ran.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := AdminURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := connect(ctx, admin)
	if err != nil {
		t.Fatalf("Postgres not reachable at %s (%v); start it with: "+
			"pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start", redact(admin), err)
		return ""
	}
	defer conn.Close(context.Background())

	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "pinned_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
		return ""
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := connect(ctx, admin)
		if err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 5*time.Second {
		cfg.ConnectTimeout = 5 * time.Second
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// withDatabase returns dsn pointing at database name, for URL and keyword/value DSNs alike.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// In keyword/value form a later keyword overrides an earlier one.
	return dsn + " dbname=" + name, nil
}

// redact hides a password in a URL DSN before it goes into a message.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	return u.Redacted()
}
