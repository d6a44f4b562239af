package httpx

import (
	"context"
	"net/http"
	"strconv"
	"strings"
)

// Writing request heads by hand, for the paths that send a request without
// an http.Request (the forwarding hop, the kept-alive loop). The caller
// has checked that names and values hold no CR, LF or NUL.

// HopByHop are the fields a proxy drops (RFC 9110 7.6.1, and the ones
// httputil.ReverseProxy drops).
var HopByHop = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// AppendRequestLine starts a request head: the request line and Host.
func AppendRequestLine(dst []byte, method, target, host string) []byte {
	dst = append(dst, method...)
	dst = append(dst, ' ')
	dst = append(dst, target...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	return append(dst, "\r\n"...)
}

// AppendField writes one header field.
func AppendField(dst []byte, k, v string) []byte {
	dst = append(dst, k...)
	dst = append(dst, ": "...)
	dst = append(dst, v...)
	return append(dst, "\r\n"...)
}

// AppendBody ends a request head and appends the body: as
// http.Request.Write, a length for every body, and an empty one for
// methods other than GET and HEAD.
func AppendBody(dst []byte, method string, body []byte) []byte {
	if len(body) > 0 || method != http.MethodGet && method != http.MethodHead {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(len(body)), 10)
		dst = append(dst, "\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...)
}

type trustedForwardingKey struct{}

// WithTrustedForwarding marks a request whose X-Forwarded-For, -Host and
// -Proto were set by a peer the receiver trusts (a node that attested the
// request): they pass on to the instance, the peer's address appended to
// X-Forwarded-For, instead of being replaced.
func WithTrustedForwarding(ctx context.Context) context.Context {
	return context.WithValue(ctx, trustedForwardingKey{}, true)
}

// TrustedForwarding reports whether ctx carries WithTrustedForwarding.
func TrustedForwarding(ctx context.Context) bool {
	v, _ := ctx.Value(trustedForwardingKey{}).(bool)
	return v
}

// TokenListHas reports whether the comma-separated list holds token
// (case-insensitive), as in Connection and Te fields.
func TokenListHas(list, token string) bool {
	for t := range strings.SplitSeq(list, ",") {
		if strings.EqualFold(strings.TrimSpace(t), token) {
			return true
		}
	}
	return false
}
