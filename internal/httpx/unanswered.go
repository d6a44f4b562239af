package httpx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// What a hop (a front door forwarding to an owner, an owner relaying to its plugin) answers
// for a request that got no complete response head. The status code is a promise to the
// client about whether the request ran:
//
//   - 503 + Retry-After: it certainly did not run. Nothing of it reached the upstream (the
//     connection was refused or could not be made), so sending it again is safe, whatever it is.
//   - 504, no Retry-After, {"error": "...; the request may have run", "outcome": "unknown"}:
//     the request was sent and the upstream's connection was cut or timed out before a
//     complete response head. It may have run, wholly or in part; only a request that is safe
//     to repeat (idempotent, or carrying a dedupe key, as Statewire frames do) may be sent
//     again.
//   - 413: the client's body ran over the front door's cap (http.MaxBytesReader) while it was
//     being sent on. The upstream got the head and at most the cap's bytes of a body that then
//     broke off; the client's connection closes.
//
// A hop never sends a request again itself once any of it may have reached the upstream.

// ErrNotSent marks a round trip's error from before any byte of the request was written to the
// upstream (SyncTransport: a dial that failed): the upstream certainly did not see it.
var ErrNotSent = errors.New("request not sent")

// Outcomes of an unanswered request, as metrics label them.
const (
	OutcomeUnreachable = "unreachable" // nothing was sent: it did not run
	OutcomeUnknown     = "unknown"     // sent, then no answer: it may have run
	OutcomeTooLarge    = "too-large"   // the client's body ran over the cap on its way
)

// ShuttingDownMsg is the error of the 503 a stopping node answers a request it no longer starts.
const ShuttingDownMsg = "node is shutting down"

// UnknownOutcomeMsg is the error of a 504 for a request that may have run.
const UnknownOutcomeMsg = "owner did not answer in time; the request may have run"

// Unanswered is the answer to a request its upstream did not answer.
type Unanswered struct {
	Outcome    string        // OutcomeUnreachable, OutcomeUnknown or OutcomeTooLarge
	Status     int           // 503, 504 or 413
	Message    string        // the body's "error"
	RetryAfter time.Duration // > 0 only for 503
}

// ClassifyUnanswered is the one rule for a request that got no response head: err is why (a
// round trip's or a relay's error). It is OutcomeUnreachable (503 + Retry-After, with
// unreachableMsg) only when err says nothing was sent: ErrNotSent, or a dial's error (as
// net/http's Transport returns it); anything else, a timeout or a cut connection after the
// request went out, is OutcomeUnknown (504, the request may have run); a body cut at the cap
// (err holds an *http.MaxBytesError) is the client's, OutcomeTooLarge (413).
func ClassifyUnanswered(err error, unreachableMsg string) Unanswered {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return Unanswered{Outcome: OutcomeTooLarge, Status: http.StatusRequestEntityTooLarge, Message: BodyTooLargeMsg(tooLarge.Limit)}
	}
	if NotSent(err) {
		return Unanswered{Outcome: OutcomeUnreachable, Status: http.StatusServiceUnavailable, Message: unreachableMsg, RetryAfter: time.Second}
	}
	return Unanswered{Outcome: OutcomeUnknown, Status: http.StatusGatewayTimeout, Message: UnknownOutcomeMsg}
}

// BodyTooLargeMsg is the error of a 413 for a request body over limit bytes.
func BodyTooLargeMsg(limit int64) string {
	return "request body too large: the limit is " + strconv.FormatInt(limit, 10) + " bytes"
}

// NotSent reports whether err certainly came before any of the request reached the upstream.
func NotSent(err error) bool {
	if errors.Is(err, ErrNotSent) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Write answers w.
func (u Unanswered) Write(w http.ResponseWriter) {
	if u.Outcome == OutcomeUnknown {
		WriteJSON(w, u.Status, map[string]string{"error": u.Message, "outcome": OutcomeUnknown})
		return
	}
	WriteError(w, u.Status, u.Message, u.RetryAfter)
}

// AppendResponse appends the whole HTTP/1.1 response (for an event loop that writes its own).
func (u Unanswered) AppendResponse(dst []byte) []byte {
	body := strconv.AppendQuote([]byte(`{"error":`), u.Message)
	if u.Outcome == OutcomeUnknown {
		body = append(body, `,"outcome":"unknown"`...)
	}
	body = append(body, "}\n"...)
	dst = fmt.Appendf(dst, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n", u.Status, http.StatusText(u.Status))
	if u.RetryAfter > 0 {
		dst = append(dst, "Retry-After: "...)
		dst = append(dst, RetryAfterSeconds(u.RetryAfter)...)
		dst = append(dst, "\r\n"...)
	}
	dst = fmt.Appendf(dst, "Content-Length: %d\r\n\r\n", len(body))
	return append(dst, body...)
}

// notSent wraps err (a dial's) with ErrNotSent; a cancellation stays what it is.
func notSent(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrNotSent) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrNotSent, err)
}
