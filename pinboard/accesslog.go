package pinboard

import (
	"context"
	"net/http"
	"time"
)

// The access log (FrontDoorConfig.AccessLog): one INFO line "request" per
// front-door request, with method, path (escaped, no query: queries may
// carry secrets), status, bytes written, duration, and where it was served:
// "here", or "forwarded" to the owner's node. While it is on, the front
// door keeps every connection in net/http (no kept-alive loop), so no
// request goes unlogged; held streams still go to the relay loop, logged
// when they leave net/http as "relayed" with the owner's status.

type accessKey struct{}

// accessEntry is what the handlers note about a request for its line.
type accessEntry struct {
	served  string // "here", "forwarded"
	node    string // the owner's node id, when forwarded
	relayed bool   // a held stream went to the relay loop
	status  int    // the owner's status for a relayed stream
}

// noteServed records where the request was served, if it is being logged.
// A request retried elsewhere keeps the last note.
func noteServed(r *http.Request, served, node string) {
	if e, ok := r.Context().Value(accessKey{}).(*accessEntry); ok {
		e.served, e.node = served, node
	}
}

// noteRelayed records that a held stream left net/http for the relay loop.
func noteRelayed(r *http.Request, status int) {
	if e, ok := r.Context().Value(accessKey{}).(*accessEntry); ok {
		e.relayed, e.status = true, status
	}
}

// accessWriter counts what the handler wrote.
type accessWriter struct {
	http.ResponseWriter
	code    int
	written int64
}

func (w *accessWriter) WriteHeader(code int) {
	if w.code < 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *accessWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.written += int64(n)
	return n, err
}

func (w *accessWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveLogged serves r and writes its access log line.
func (f *FrontDoor) serveLogged(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	e := &accessEntry{}
	aw := &accessWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), accessKey{}, e))
	defer func() {
		status := aw.code
		args := []any{"method", r.Method, "path", r.URL.EscapedPath(), "remote", r.RemoteAddr}
		if e.relayed {
			status = e.status
			args = append(args, "relayed", true)
		}
		args = append(args, "status", status, "bytes", aw.written, "duration", time.Since(start))
		if e.served != "" {
			args = append(args, "served", e.served)
		}
		if e.node != "" {
			args = append(args, "node", e.node)
		}
		f.cfg.Logger.Info("request", args...)
	}()
	f.serve(aw, r)
}
