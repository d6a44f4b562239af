package pgtest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

func TestNewDatabase(t *testing.T) {
	var dsn string
	t.Run("create", func(t *testing.T) {
		dsn = pgtest.NewDatabase(t)
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatalf("connect to the new database: %v", err)
		}
		defer conn.Close(context.Background())
		var name string
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, "pinned_test_") {
			t.Fatalf("connected to %q, want a fresh pinned_test_ database", name)
		}
	})
	// The subtest's cleanup dropped it.
	conn, err := pgx.Connect(t.Context(), dsn)
	if err == nil {
		conn.Close(context.Background())
		t.Fatalf("database %s still exists after its test ended", dsn)
	}
}

// fatalTB records Fatalf instead of ending the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper()               {}
func (f *fatalTB) Cleanup(func())        {}
func (f *fatalTB) Errorf(string, ...any) {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestUnreachableFailsWithInstructions(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	f := &fatalTB{}
	pgtest.NewDatabase(f)
	if !strings.Contains(f.msg, "Postgres not reachable at postgres://postgres@127.0.0.1:1/test") ||
		!strings.Contains(f.msg, "pg_ctlcluster --skip-systemctl-redirect") {
		t.Fatalf("message = %q, want where it looked and how to start Postgres", f.msg)
	}
}
