package clustertls

import (
	"errors"
	"testing"
	"time"
)

// A proof holds for its request and token only, inside its window.
func TestJoinProof(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"n2"}`)
	proof, err := JoinProof("token-a", "POST", "/_raft/join", body, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckJoinProof("token-a", proof, "POST", "/_raft/join", body, now.Add(JoinProofWindow/2)); err != nil {
		t.Fatalf("the request's own proof: %v", err)
	}
	for name, c := range map[string]struct {
		token, proof, method, path, body string
		at                               time.Time
	}{
		"another token":   {"token-b", proof, "POST", "/_raft/join", string(body), now},
		"another body":    {"token-a", proof, "POST", "/_raft/join", `{"id":"evil"}`, now},
		"another path":    {"token-a", proof, "POST", "/_raft/certificate", string(body), now},
		"another method":  {"token-a", proof, "PUT", "/_raft/join", string(body), now},
		"too late":        {"token-a", proof, "POST", "/_raft/join", string(body), now.Add(JoinProofWindow + time.Second)},
		"too early":       {"token-a", proof, "POST", "/_raft/join", string(body), now.Add(-JoinProofWindow - time.Second)},
		"no dot":          {"token-a", "abc", "POST", "/_raft/join", string(body), now},
		"bad hex":         {"token-a", "1800000000.zz", "POST", "/_raft/join", string(body), now},
		"empty":           {"token-a", "", "POST", "/_raft/join", string(body), now},
		"time not signed": {"token-a", "1800000001" + proof[10:], "POST", "/_raft/join", string(body), now},
	} {
		if err := CheckJoinProof(c.token, c.proof, c.method, c.path, []byte(c.body), c.at); !errors.Is(err, ErrBadProof) {
			t.Errorf("%s: %v, want ErrBadProof", name, err)
		}
	}
}
