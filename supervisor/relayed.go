package supervisor

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/plugins"
)

// Relayed requests: a caller with its own event loop (pinboard's kept-alive
// loop, serving a peer node's connection) carries a request to the plugin's
// data socket itself, without net/http or ReverseProxy on this side. The
// supervisor still owns everything about the instance: Relay holds it as a
// served request does (idle eviction waits, drain and wind-down count it,
// a stream is marked as one), writes the request exactly as ServeInstance
// would send it, and the Forward's hooks release it, record the request
// and, if the plugin refuses (it does not hold the instance), drop it.

// relayFailMsg is the loop's own 503 for a relayed request that got no
// answer: the plugin is gone or restarting.
const relayFailMsg = "instance restarting, retry"

// Relay starts a request to (ns, id) for the caller's loop: h is the
// parsed request, target its path on the instance (escaped, with its
// query). Only an instance that is live here under exactly generation gen,
// activated and on a running plugin's data socket qualifies: Relay never
// activates and never waits (ok false: serve it with ServeInstance).
// trusted says h's X-Forwarded-* fields come from a peer node and pass on
// (see httpx.WithTrustedForwarding); otherwise they are replaced. The
// Forward's Done must run exactly once.
func (s *Supervisor) Relay(ns, id string, gen uint64, h *relay.ReqHead, target string, trusted bool) (relay.Forward, bool) {
	k := Key{ns, id}
	s.mu.Lock()
	in := s.instances[k]
	if s.stopping || in == nil || in.evicting || in.gen != gen || !closed(in.ready) || in.err != nil || !in.inc.alive() || in.ctx.Err() != nil {
		s.mu.Unlock()
		return relay.Forward{}, false
	}
	in.conns++ // see armIdleLocked
	rs := &reqState{in: in}
	if in.relayed == nil {
		in.relayed = map[*reqState]relay.Ticket{}
	}
	in.relayed[rs] = h.Ticket // an eviction ends the exchange (abortRelayedOnCancel)
	s.mu.Unlock()

	start := time.Now()
	wire := relay.WireBuffer()
	*wire = appendPluginRequest(*wire, h, pluginFields(in.inc, k), target, trusted)
	return relay.Forward{
		Addr:    in.inc.socket,
		Wire:    *wire,
		Refusal: plugins.HeaderRefusal,
		Final:   true,
		FailMsg: relayFailMsg,
		Timeout: -1, // a handler may hold a request as long as it likes, as through ServeInstance
		Head: func(_ int, stream bool) {
			if stream {
				s.markStream(rs)
			}
		},
		Done: func(status int, err error) {
			relay.ReleaseWire(wire)
			if errors.Is(err, relay.ErrRefused) && s.remove(in) {
				s.metrics.instances.WithLabelValues(ns).Dec()
			}
			if status != 0 {
				s.metrics.observe(ns, status, time.Since(start))
			}
			s.releaseConn(in, rs)
		},
	}, true
}

// abortRelayedOnCancel makes the end of in's context (its eviction) abort
// the requests relayed to it: one hook per instance, not one per request.
func (s *Supervisor) abortRelayedOnCancel(in *instance) {
	context.AfterFunc(in.ctx, func() {
		s.mu.Lock()
		tickets := in.relayed
		in.relayed = nil
		s.mu.Unlock()
		for _, t := range tickets {
			t.Abort()
		}
	})
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// appendPluginRequest writes h for the plugin as ServeInstance's proxy
// does: pinned's fields (pluginFields: the instance, the socket secret;
// any X-Pinned-* the request carried dropped), hop-by-hop fields dropped,
// X-Forwarded-* set (the trusted peer's extended by its address), a length
// for every body.
func appendPluginRequest(dst []byte, h *relay.ReqHead, pinned [3]pluginField, target string, trusted bool) []byte {
	dst = httpx.AppendRequestLine(dst, h.Method, target, h.Host)
	var xfh, xfp string
	xff := make([]string, 0, 4) // the peer's X-Forwarded-For fields (one, from pinnedd)
	trailers := false
	for _, fl := range h.Fields {
		name := http.CanonicalHeaderKey(fl.Name)
		switch {
		case !trusted && (name == "X-Forwarded-For" || name == "X-Forwarded-Host" || name == "X-Forwarded-Proto"):
			continue
		case name == "X-Forwarded-For":
			xff = append(xff, fl.Value)
			continue
		case name == "X-Forwarded-Host":
			if xfh == "" {
				xfh = fl.Value
			}
			continue
		case name == "X-Forwarded-Proto":
			if xfp == "" {
				xfp = fl.Value
			}
			continue
		case name == "Te":
			trailers = trailers || httpx.TokenListHas(fl.Value, "trailers")
			continue
		case httpx.HopByHop[name], name == "Content-Length", name == "Forwarded", strings.HasPrefix(name, "X-Pinned-"):
			continue
		}
		dst = httpx.AppendField(dst, fl.Name, fl.Value)
	}
	if trailers {
		dst = append(dst, "Te: trailers\r\n"...)
	}
	for _, f := range pinned {
		dst = httpx.AppendField(dst, f.name, f.value)
	}
	if ip, _, err := net.SplitHostPort(h.RemoteAddr); err == nil {
		xff = append(xff, ip)
	}
	if len(xff) > 0 {
		dst = append(dst, "X-Forwarded-For: "...)
		for i, v := range xff {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = append(dst, v...)
		}
		dst = append(dst, "\r\n"...)
	}
	if xfh == "" {
		xfh = h.Host
	}
	dst = httpx.AppendField(dst, "X-Forwarded-Host", xfh)
	if xfp == "" {
		xfp = "http"
	}
	dst = httpx.AppendField(dst, "X-Forwarded-Proto", xfp)
	return httpx.AppendBody(dst, h.Method, h.Body)
}
