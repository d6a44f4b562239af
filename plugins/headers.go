package plugins

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/pinnedd/pinnedd/plugins/proto"
)

// Request headers pinnedd sets on every request it hands to a plugin; the
// SDK routes on them and strips them before the instance sees the request.
const (
	HeaderNamespace = "X-Pinned-Namespace"
	HeaderID        = "X-Pinned-Id"
	// HeaderRefusal marks a response refused in-band, by pinnedd or a
	// plugin rather than by instance code; its value says why (Refusal*).
	HeaderRefusal = "X-Pinned-Refusal"
	// HeaderClusterCall marks a request an instance makes through its own
	// node's front door (a cluster call); its value is ClusterCallValue:
	// the calling instance's namespace and its process's cluster-call
	// credential (DescribeRequest.cluster_call_token).
	HeaderClusterCall = "X-Pinned-Cluster-Call"
	// HeaderSocketSecret carries the plugin process's data-socket secret
	// (DescribeRequest.socket_secret) on every request pinnedd writes to
	// the data socket; the SDK refuses a request without it and strips it.
	HeaderSocketSecret = "X-Pinned-Socket-Secret"
)

// ErrClusterCallMalformed: an X-Pinned-Cluster-Call value that is not
// "<namespace> <credential>".
var ErrClusterCallMalformed = errors.New("malformed " + HeaderClusterCall + ": want \"<namespace> <credential>\"")

// ClusterCallValue is the HeaderClusterCall value for a call from an
// instance of namespace ns holding credential token.
func ClusterCallValue(ns, token string) string { return ns + " " + token }

// ParseClusterCall splits a HeaderClusterCall value into the calling
// namespace and the credential. The front door then asks the supervisor
// whether the credential is live and covers that namespace.
func ParseClusterCall(v string) (ns, token string, err error) {
	ns, token, ok := strings.Cut(v, " ")
	if !ok || token == "" || strings.ContainsAny(token, " \t") {
		return "", "", ErrClusterCallMalformed
	}
	if err := ValidateNamespace(ns); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrClusterCallMalformed, err)
	}
	return ns, token, nil
}

// In-band refusal reasons (HeaderRefusal values), shared by the plugin SDK,
// the supervisor and the front door.
const (
	// RefusalInactive: the plugin does not have the instance (it
	// restarted); pinnedd re-activates it.
	RefusalInactive = "inactive"
	// RefusalDraining and RefusalLeaseUnhealthy: the owner takes no new
	// activation; a forwarding front door releases the placement and
	// retries on another worker.
	RefusalDraining       = "draining"
	RefusalLeaseUnhealthy = "lease-unhealthy"
	// RefusalNotOwner: the forwarded request named a placement this node
	// does not hold under that generation; the forwarder asks the leader.
	RefusalNotOwner = "not-owner"
)

// maxFrame bounds one body frame on the gRPC data plane (gRPC's default
// message limit is 4 MiB).
const maxFrame = 64 << 10

func toHeaders(h http.Header) []*proto.Header {
	out := make([]*proto.Header, 0, len(h))
	for k, v := range h {
		out = append(out, &proto.Header{Name: k, Values: v})
	}
	return out
}

func fromHeaders(hs []*proto.Header) http.Header {
	h := make(http.Header, len(hs))
	for _, x := range hs {
		h[x.Name] = x.Values
	}
	return h
}

// GRPCTransport is an http.RoundTripper that carries each request over one
// Data.Exchange stream. It is the measured alternative to HTTP over the
// plugin's unix socket (see BenchmarkDataPlane); it streams both ways and
// flushes every chunk the instance writes.
type GRPCTransport struct {
	Data proto.DataClient
}

// RoundTrip implements http.RoundTripper.
func (t *GRPCTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	stream, err := t.Data.Exchange(req.Context())
	if err != nil {
		return nil, fmt.Errorf("open data stream: %w", err)
	}
	head := &proto.RequestHead{
		Method:    req.Method,
		Path:      req.URL.Path,
		RawQuery:  req.URL.RawQuery,
		Headers:   toHeaders(req.Header),
		Namespace: req.Header.Get(HeaderNamespace),
		Id:        req.Header.Get(HeaderID),
	}
	if err := stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_Request{Request: head}}); err != nil {
		return nil, fmt.Errorf("send request head: %w", err)
	}
	go func() {
		// gRPC forbids concurrent Send; only this goroutine sends from here on.
		if req.Body != nil {
			buf := make([]byte, maxFrame)
			for {
				n, rerr := req.Body.Read(buf)
				if n > 0 {
					if err := stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_Body{Body: append([]byte(nil), buf[:n]...)}}); err != nil {
						return
					}
				}
				if rerr != nil {
					break
				}
			}
		}
		_ = stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_End{End: true}})
		_ = stream.CloseSend()
	}()
	first, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("receive response head: %w", err)
	}
	rh := first.GetResponse()
	if rh == nil {
		return nil, errors.New("data stream: first frame is not a response head")
	}
	return &http.Response{
		Status:     http.StatusText(int(rh.Status)),
		StatusCode: int(rh.Status),
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        fromHeaders(rh.Headers),
		Body:          &frameReader{recv: stream.Recv},
		ContentLength: -1,
		Request:       req,
	}, nil
}

// frameReader turns body frames into an io.Reader.
type frameReader struct {
	recv func() (*proto.HTTPFrame, error)
	buf  []byte
	done bool
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		f, err := r.recv()
		if err == io.EOF {
			r.done = true
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		switch x := f.Frame.(type) {
		case *proto.HTTPFrame_Body:
			r.buf = x.Body
		case *proto.HTTPFrame_End:
			r.done = true
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *frameReader) Close() error { return nil }

// ServeExchange runs one Data.Exchange stream against h (the plugin side).
func ServeExchange(stream proto.Data_ExchangeServer, h http.Handler) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	head := first.GetRequest()
	if head == nil {
		return errors.New("data stream: first frame is not a request head")
	}
	req, err := http.NewRequestWithContext(stream.Context(), head.Method, head.Path, &frameReader{recv: stream.Recv})
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.URL.RawQuery = head.RawQuery
	req.RequestURI = req.URL.RequestURI()
	req.Header = fromHeaders(head.Headers)
	w := &frameWriter{stream: stream, header: http.Header{}}
	h.ServeHTTP(w, req)
	w.WriteHeader(http.StatusOK)
	return stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_End{End: true}})
}

// frameWriter is the http.ResponseWriter of the gRPC data plane: every Write
// is sent at once, so Flush has nothing left to do.
type frameWriter struct {
	mu     sync.Mutex
	stream proto.Data_ExchangeServer
	header http.Header
	wrote  bool
	err    error
}

func (w *frameWriter) Header() http.Header { return w.header }

func (w *frameWriter) WriteHeader(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(status)
}

func (w *frameWriter) writeHeaderLocked(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.err = w.stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_Response{Response: &proto.ResponseHead{
		Status: int32(status), Headers: toHeaders(w.header),
	}}})
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(http.StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	for off := 0; off < len(p); off += maxFrame {
		end := min(off+maxFrame, len(p))
		if err := w.stream.Send(&proto.HTTPFrame{Frame: &proto.HTTPFrame_Body{Body: p[off:end]}}); err != nil {
			w.err = err
			return off, err
		}
	}
	return len(p), nil
}

func (w *frameWriter) Flush() {}
