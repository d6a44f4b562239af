package httpx

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
)

// The one rule: 503 + Retry-After only for what certainly was not sent;
// everything else may have run (504, no Retry-After).
func TestClassifyUnanswered(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"ErrNotSent", fmt.Errorf("%w: %w", ErrNotSent, errors.New("no route")), OutcomeUnreachable},
		{"net/http's dial error", refused, OutcomeUnreachable},
		{"a dial error wrapped", fmt.Errorf("forward: %w", refused), OutcomeUnreachable},
		{"a read cut short", io.ErrUnexpectedEOF, OutcomeUnknown},
		{"connection reset on read", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, OutcomeUnknown},
		{"header timeout", os.ErrDeadlineExceeded, OutcomeUnknown},
		{"a context deadline", context.DeadlineExceeded, OutcomeUnknown},
		{"anything else", errors.New("owner switched protocols unasked"), OutcomeUnknown},
		{"the client's body over the cap", fmt.Errorf("write: %w", &http.MaxBytesError{Limit: 1024}), OutcomeTooLarge},
	} {
		u := ClassifyUnanswered(tc.err, "owner unreachable, retry")
		if u.Outcome != tc.want {
			t.Errorf("%s: outcome %s, want %s", tc.name, u.Outcome, tc.want)
			continue
		}
		rec := httptest.NewRecorder()
		u.Write(rec)
		wire := u.AppendResponse(nil)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(wire)), nil)
		if err != nil {
			t.Fatalf("%s: AppendResponse wrote no valid response: %v\n%s", tc.name, err, wire)
		}
		loopBody, _ := io.ReadAll(resp.Body)
		for _, got := range []struct {
			how        string
			code       int
			retryAfter string
			body       string
		}{
			{"Write", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String()},
			{"AppendResponse", resp.StatusCode, resp.Header.Get("Retry-After"), string(loopBody)},
		} {
			switch tc.want {
			case OutcomeTooLarge:
				if got.code != 413 || got.retryAfter != "" ||
					got.body != `{"error":"request body too large: the limit is 1024 bytes"}`+"\n" {
					t.Errorf("%s via %s: %d Retry-After %q %q", tc.name, got.how, got.code, got.retryAfter, got.body)
				}
			case OutcomeUnreachable:
				if got.code != 503 || got.retryAfter != "1" || got.body != `{"error":"owner unreachable, retry"}`+"\n" {
					t.Errorf("%s via %s: %d Retry-After %q %q", tc.name, got.how, got.code, got.retryAfter, got.body)
				}
			default:
				if got.code != 504 || got.retryAfter != "" ||
					got.body != `{"error":"owner did not answer in time; the request may have run","outcome":"unknown"}`+"\n" {
					t.Errorf("%s via %s: %d Retry-After %q %q", tc.name, got.how, got.code, got.retryAfter, got.body)
				}
			}
		}
	}
}

// SyncTransport marks what it never sent: a refused dial is ErrNotSent, a
// connection cut after the request went out is not.
func TestSyncTransportMarksUnsent(t *testing.T) {
	tr := newSync(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	req, _ := http.NewRequest("POST", "http://"+addr+"/x", strings.NewReader("body"))
	_, err = tr.RoundTrip(req)
	if err == nil || !NotSent(err) || !errors.Is(err, ErrNotSent) {
		t.Fatalf("refused dial: %v, want ErrNotSent", err)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close()
	}))
	defer srv.Close()
	for _, body := range []string{"body", strings.Repeat("x", SyncBodyLimit+1)} { // ours, then Fallback's
		req, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader(body))
		_, err = tr.RoundTrip(req)
		if err == nil || NotSent(err) {
			t.Fatalf("cut after the request (%d bytes): %v, want an error that is not ErrNotSent", len(body), err)
		}
	}
}
