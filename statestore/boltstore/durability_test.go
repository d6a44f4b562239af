package boltstore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
)

var (
	inst = statestore.InstanceKey{Namespace: "/threads", ID: "t1"}
	tray = statestore.TrayKey{NS: "client_commands", ID: "c1"}
)

// TestMain lets the test binary double as the writer process that TestKillNine kills.
func TestMain(m *testing.M) {
	if path := os.Getenv("BOLTSTORE_WRITER"); path != "" {
		os.Exit(writer(path))
	}
	os.Exit(m.Run())
}

// writer commits forever, printing each acknowledged seq, until it is killed.
func writer(path string) int {
	s, err := boltstore.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := 0; ; i++ {
		res, err := s.Commit(context.Background(), inst, 1, []statestore.Mutation{
			statestore.AppendItems{Tray: tray, Payloads: [][]byte{[]byte(strconv.Itoa(i))}},
			statestore.SetField{Tray: tray, Name: "last", Value: []byte(strconv.Itoa(i))},
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("acked %d\n", res.Seqs[0][0])
	}
}

// TestKillNine: every commit acknowledged before kill -9 is there after reopening.
func TestKillNine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BOLTSTORE_WRITER="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []int64
	sc := bufio.NewScanner(out)
	for len(acked) < 50 && sc.Scan() {
		seq, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "acked "), 10, 64)
		if err != nil {
			t.Fatalf("writer said %q", sc.Text())
		}
		acked = append(acked, seq)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no deferred cleanup runs
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(acked) < 50 {
		t.Fatalf("writer acknowledged only %d commits before exiting", len(acked))
	}

	s := open(t, path)
	defer s.Close()
	trays, err := s.Load(context.Background(), inst, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(trays) != 1 {
		t.Fatalf("trays after kill -9: %v", trays)
	}
	have := map[int64]bool{}
	for _, it := range trays[0].Items {
		have[it.Seq] = true
	}
	for _, seq := range acked {
		if !have[seq] {
			t.Fatalf("acknowledged seq %d lost by kill -9 (%d items stored)", seq, len(trays[0].Items))
		}
	}
	// The counter resumes past everything stored, acknowledged or not.
	res, err := s.Commit(context.Background(), inst, 1, []statestore.Mutation{
		statestore.AppendItems{Tray: tray, Payloads: [][]byte{[]byte("after")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if last := trays[0].Items[len(trays[0].Items)-1].Seq; res.Seqs[0][0] <= last {
		t.Fatalf("seq after restart %d <= stored %d", res.Seqs[0][0], last)
	}
}

func TestSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	defer s.Close()
	if s2, err := boltstore.Open(path); err == nil {
		s2.Close()
		t.Fatal("a second Open of a file in use succeeded")
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte{0, 0, 0, 0, 0, 0, 0, 99})
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if s, err := boltstore.Open(path); err == nil || !strings.Contains(err.Error(), "schema version 99") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open of a newer schema: err = %v, want a refusal", err)
	}
}
