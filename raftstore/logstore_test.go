package raftstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A data dir written with the bolt log keeps it when reopened with no
// format named; asking for the WAL there is refused (an empty WAL would
// look like a new node, and --bootstrap would found a second cluster).
func TestLogStoreFormatSticksToDataDir(t *testing.T) {
	dir := t.TempDir()
	bolt := func(c *Config) { c.LogStore = LogStoreBolt }
	n := startNode(t, "n1", dir, "", true, bolt)
	waitLeader(t, n)
	mustApply(t, n, "a")
	n.close()
	if _, err := os.Stat(filepath.Join(dir, "raft", "raft.db")); err != nil {
		t.Fatalf("bolt log missing: %v", err)
	}

	_, err := Open(context.Background(), fastConfig(Config{
		NodeID: "n1", RaftAddr: "127.0.0.1:0", APIAddr: "http://x", DataDir: dir, Bootstrap: true, LogStore: LogStoreWAL,
	}), &listSM{})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("WAL asked on a bolt data dir: %v, want ErrInvalidConfig", err)
	}

	n2 := startNode(t, "n1", dir, "", true, nil) // no format named: the dir's own
	if !n2.s.HadExistingState() {
		t.Fatal("bolt data dir reopened as new")
	}
	waitLeader(t, n2)
	mustApply(t, n2, "b")
	if got := n2.sm.list(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("state %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "raft", "wal")); !os.IsNotExist(err) {
		t.Fatalf("a WAL was created beside the bolt log: %v", err)
	}
}

func TestChooseLogStore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		present []string
		want    string
		got     string
		bad     bool
	}{
		{name: "new dir defaults to WAL", got: LogStoreWAL},
		{name: "new dir, bolt asked", want: LogStoreBolt, got: LogStoreBolt},
		{name: "WAL dir", present: []string{"wal"}, got: LogStoreWAL},
		{name: "bolt dir", present: []string{"raft.db"}, got: LogStoreBolt},
		{name: "bolt dir, WAL asked", present: []string{"raft.db"}, want: LogStoreWAL, bad: true},
		{name: "WAL dir, bolt asked", present: []string{"wal"}, want: LogStoreBolt, bad: true},
		{name: "both present", present: []string{"wal", "raft.db"}, bad: true},
		{name: "unknown format", want: "rocks", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, p := range tc.present {
				if err := os.WriteFile(filepath.Join(dir, p), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := chooseLogStore(dir, tc.want)
			if tc.bad {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("got %q, %v; want ErrInvalidConfig", got, err)
				}
				return
			}
			if err != nil || got != tc.got {
				t.Fatalf("got %q, %v; want %q", got, err, tc.got)
			}
		})
	}
}

// A second Open on a data dir in use fails at once; after Close it opens.
func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, "n1", dir, "", true, nil)
	waitLeader(t, n)
	_, err := Open(context.Background(), fastConfig(Config{
		NodeID: "n1", RaftAddr: "127.0.0.1:0", APIAddr: "http://x", DataDir: dir, Bootstrap: true,
	}), &listSM{})
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Open: %v, want ErrDataDirInUse", err)
	}
	n.close()
	n2 := startNode(t, "n1", dir, "", true, nil)
	waitLeader(t, n2)
}
