// Package httpx holds the JSON response helpers every pinnedd HTTP surface
// shares, so errors look the same wherever they come from:
// {"error": "..."} with Retry-After on refusals that are worth retrying.
package httpx

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// WriteJSON writes v as JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes {"error": msg} with status code, and Retry-After in
// whole seconds (at least 1) when retryAfter > 0.
func WriteError(w http.ResponseWriter, code int, msg string, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", RetryAfterSeconds(retryAfter))
	}
	WriteJSON(w, code, map[string]string{"error": msg})
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// Abandon ends, unanswered, the response of a handler whose client left
// (its request's context ended). Returning instead would have net/http
// send an implicit 200 with no body, which a client still reading (one
// that only half-closed its connection, which ends the context too, or a
// hop whose context ended for another reason) would take for an answer.
func Abandon() { panic(http.ErrAbortHandler) }
