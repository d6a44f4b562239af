package frontdoor

import (
	"context"
	"net/http"
	"time"
)

// The access log (Config.AccessLog): one INFO line "request" per
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

// serveLogged serves r and writes its access log line.
func (f *FrontDoor) serveLogged(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	e := &accessEntry{}
	aw := &lengthWriter{ResponseWriter: w}
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
		f.logger.Info("request", args...)
	}()
	f.serve(aw, r)
}
