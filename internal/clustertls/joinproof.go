package clustertls

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrBadProof means a join proof is malformed, outside its window, or not made with the token.
var ErrBadProof = errors.New("clustertls: bad join proof")

// JoinProofWindow bounds how far a join proof's time may be from the verifier's clock: wide
// enough for the clock drift the leases already tolerate, narrow enough that a copied proof
// is soon useless.
const JoinProofWindow = time.Minute

// JoinProof proves that whoever sent a request (its method, path and body, at a time) holds
// token, without sending the token: "<unix seconds>.<hex HMAC-SHA256>" keyed by PinKey(token).
// A joining node has no certificate yet and talks to a member's public port, maybe in clear:
// a listener on the way may copy the proof, and learns nothing it can use for any other
// request. Sending the same request again within the window is all it can do, and the
// verifier (raftstore) makes that harmless: a certificate is signed only for an id that is no
// member, and for the joining node's own key, which the listener lacks; a join names the
// membership fence it was made against, which every removal raises, so a join copied before a
// removal never undoes it, and before any removal it adds the same node at the same address
// again (idempotent).
func JoinProof(token, method, path string, body []byte, at time.Time) (string, error) {
	mac, err := joinMAC(token, method, path, body, at.Unix())
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(at.Unix(), 10) + "." + hex.EncodeToString(mac), nil
}

// CheckJoinProof verifies proof (JoinProof's) against token and the request, at now.
func CheckJoinProof(token, proof, method, path string, body []byte, now time.Time) error {
	ts, macHex, ok := strings.Cut(proof, ".")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil {
		return fmt.Errorf("%w: malformed", ErrBadProof)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > JoinProofWindow || d < -JoinProofWindow {
		return fmt.Errorf("%w: made at %s, %s from this node's clock (window %s)", ErrBadProof, time.Unix(sec, 0).UTC().Format(time.RFC3339), d.Round(time.Second), JoinProofWindow)
	}
	got, err := hex.DecodeString(macHex)
	if err != nil {
		return fmt.Errorf("%w: malformed", ErrBadProof)
	}
	want, err := joinMAC(token, method, path, body, sec)
	if err != nil {
		return err
	}
	if !hmac.Equal(got, want) {
		return fmt.Errorf("%w: not made with this cluster's token", ErrBadProof)
	}
	return nil
}

func joinMAC(token, method, path string, body []byte, sec int64) ([]byte, error) {
	key, err := PinKey(token)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	for _, part := range []string{"pinnedd join proof", method, path, strconv.FormatInt(sec, 10)} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	m.Write(body)
	return m.Sum(nil), nil
}
