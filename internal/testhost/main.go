// Command testhost is a plugin with one host per behaviour the tests need to
// provoke: lifecycle hooks, slow activation, panics, crashes, streams and
// upgrades. It is a real plugin binary, loaded with --plugin like any other.
//
// Hook calls are appended to the file named by TESTHOST_EVENTS, one line
// each ("start /hooks a1"), so a test can see what ran inside the process.
// TESTHOST_PROTOCOL=N makes it claim plugin protocol version N at the
// handshake, so a test can see pinnedd refuse a plugin of another version.
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/sdk"
)

var eventsMu sync.Mutex

func record(format string, args ...any) {
	path := os.Getenv("TESTHOST_EVENTS")
	if path == "" {
		return
	}
	eventsMu.Lock()
	defer eventsMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

// hooked is an instance with every lifecycle hook.
type hooked struct {
	http.Handler
	inst *sdk.Instance
	keep bool
	stop time.Duration // how long the Stop hook takes
}

func (h *hooked) Start(context.Context) error {
	record("start %s %s %d", h.inst.Namespace(), h.inst.ID(), h.inst.Generation())
	h.inst.Go("worker", func(ctx context.Context) {
		<-ctx.Done()
		record("task-done %s %s", h.inst.Namespace(), h.inst.ID())
	})
	return nil
}

func (h *hooked) Idle(context.Context) bool {
	record("idle %s %s", h.inst.Namespace(), h.inst.ID())
	return h.keep
}

func (h *hooked) Stop(context.Context) {
	time.Sleep(h.stop)
	record("stop %s %s", h.inst.Namespace(), h.inst.ID())
}

var activations atomic.Int64

// version is what GET /misc/<id>/version answers; tests build a second
// testhost with -ldflags "-X main.version=..." to see which binary serves.
var version = "dev"

var sleeping atomic.Int64

func main() {
	if p := os.Getenv("TESTHOST_PROTOCOL"); p != "" {
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testhost: TESTHOST_PROTOCOL %q: %v\n", p, err)
			os.Exit(1)
		}
		plugins.Handshake.ProtocolVersion = uint(v)
	}
	if os.Getenv("TESTHOST_SERVE_HTTP") == "1" {
		servePlainHTTP()
		return
	}
	sdk.Serve(map[string]sdk.Host{
		// /hooks: every hook recorded; evicted after 300ms idle.
		"/hooks": {
			DetachedTimeout: 300 * time.Millisecond,
			New: func(inst *sdk.Instance) (http.Handler, error) {
				return &hooked{Handler: echo(inst), inst: inst}, nil
			},
		},
		// /keep: its idle hook keeps it resident.
		"/keep": {
			DetachedTimeout: 200 * time.Millisecond,
			New: func(inst *sdk.Instance) (http.Handler, error) {
				return &hooked{Handler: echo(inst), inst: inst, keep: true}, nil
			},
		},
		// /slowstop: its Stop hook takes 500ms, so an eviction stays under
		// way long enough to overlap another.
		"/slowstop": {New: func(inst *sdk.Instance) (http.Handler, error) {
			return &hooked{Handler: echo(inst), inst: inst, stop: 500 * time.Millisecond}, nil
		}},
		// /slow: activation takes 200ms, so concurrent first requests overlap.
		"/slow": {New: func(inst *sdk.Instance) (http.Handler, error) {
			n := activations.Add(1)
			time.Sleep(200 * time.Millisecond)
			record("activate %s %s %d", inst.Namespace(), inst.ID(), n)
			return echo(inst), nil
		}},
		// /fail: activation always fails.
		"/fail": {New: func(*sdk.Instance) (http.Handler, error) {
			return nil, errors.New("this host never activates")
		}},
		// /jobs: durable work. POST /submit?mode=crash|hang appends a job;
		// the tray handler records each delivery, marks it applied, then
		// (first delivery only) exits the plugin or hangs in mode crash or
		// hang, so the test can watch it come back with resume=true.
		"/jobs": {
			New: func(inst *sdk.Instance) (http.Handler, error) {
				mux := http.NewServeMux()
				mux.HandleFunc("POST /submit", func(w http.ResponseWriter, r *http.Request) {
					job := map[string]string{"name": r.URL.Query().Get("name"), "mode": r.URL.Query().Get("mode")}
					seqs, err := inst.Tray("runs", "r").Append(r.Context(), job)
					if err != nil {
						http.Error(w, err.Error(), http.StatusServiceUnavailable)
						return
					}
					// The answer reveals only the durable append: it need
					// not wait behind the run's writes (mode crash exits
					// right after them).
					sdk.AllowUnconfirmed(r)
					w.WriteHeader(http.StatusAccepted)
					fmt.Fprintf(w, `{"seq":%d}`, seqs[0])
				})
				return mux, nil
			},
			Trays: map[string]sdk.TrayHandler{"runs": runJob},
		},
		// /misc: panics, crashes, streams, upgrades.
		"/misc": {New: func(inst *sdk.Instance) (http.Handler, error) { return misc(inst), nil }},
		// /tally: an in-memory count per instance (POST /inc, GET /value),
		// so a test can tell whether a request ran.
		"/tally": {New: func(*sdk.Instance) (http.Handler, error) { return tally(), nil }},
		// /fields: a tray's fields and large appends, answered as the SDK's
		// doc says a host answers a failed write.
		"/fields": {New: func(inst *sdk.Instance) (http.Handler, error) { return fields(inst), nil }},
	})
}

// fields serves the tray ("doc", "~"): PUT /f/{name} sets a field to the
// body, DELETE /f/{name} deletes it, GET /f lists the field names; POST
// /append?n=N&size=S appends N payloads of S bytes to the tray ("big", "~")
// (no handler: they stay).
func fields(inst *sdk.Instance) http.Handler {
	doc := inst.Tray("doc", "~")
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /f/{name}", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := doc.Set(r.PathValue("name"), string(body))
		if err == nil {
			err = inst.Durable(r.Context())
		}
		if err != nil {
			writeFailed(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /f/{name}", func(w http.ResponseWriter, r *http.Request) {
		doc.Delete(r.PathValue("name"))
		if err := inst.Durable(r.Context()); err != nil {
			writeFailed(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /f", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(doc.Fields())
	})
	mux.HandleFunc("POST /append", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		size, _ := strconv.Atoi(r.URL.Query().Get("size"))
		payloads := make([]any, n)
		for i := range payloads {
			payloads[i] = strings.Repeat("x", max(size-2, 0)) // a JSON string of size bytes
		}
		seqs, err := inst.Tray("big", "~").Append(r.Context(), payloads...)
		if err != nil {
			writeFailed(w, err)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"appended": len(seqs), "items": len(inst.Tray("big", "~").Items())})
	})
	return mux
}

// writeFailed answers a failed state write as the SDK's package doc says.
func writeFailed(w http.ResponseWriter, err error) {
	code := http.StatusGatewayTimeout // queued, not known stored: it may have run
	switch {
	case errors.Is(err, sdk.ErrInvalidWrite):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, sdk.ErrFenced):
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

func tally() http.Handler {
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /inc", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, `{"value":%d}`, n.Add(1)) })
	mux.HandleFunc("GET /value", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, `{"value":%d}`, n.Load()) })
	return mux
}

// echo answers with what the instance saw of the request.
func echo(inst *sdk.Instance) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"namespace": inst.Namespace(), "id": inst.ID(), "generation": inst.Generation(),
			"method": r.Method, "path": r.URL.Path, "query": r.URL.RawQuery, "body": string(body),
			"pinnedHeader": r.Header.Get("X-Pinned-Namespace"), "forwardedFor": r.Header.Get("X-Forwarded-For"),
			"host": r.Host, "headers": r.Header, "contentLength": r.ContentLength,
		})
	})
}

func misc(inst *sdk.Instance) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/crash", func(http.ResponseWriter, *http.Request) { os.Exit(3) })
	// How many /sleep requests this process holds: a test that must act
	// while one is inside the plugin (not merely admitted) waits for it.
	mux.HandleFunc("/sleeping", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, sleeping.Load()) })
	mux.HandleFunc("/pid", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, os.Getpid()) })
	mux.HandleFunc("/version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, version) })
	mux.HandleFunc("/call", func(w http.ResponseWriter, r *http.Request) {
		// A cluster call: ?target=/ns/id/rest (any path of the front
		// door) with ?method (POST if none) through this node's front
		// door, answering with what came back.
		method := cmp.Or(r.URL.Query().Get("method"), http.MethodPost)
		req, err := http.NewRequestWithContext(r.Context(), method, r.URL.Query().Get("target"), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := inst.ClusterClient().Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		eventStream(w, r, inst, t.C)
	})
	// /gated: an event stream that sends its next event only when told to
	// (POST /gated/next), so a test can prove each event arrived before the
	// next was written; GET /gated/open counts the streams still open here.
	gate := make(chan time.Time)
	var open atomic.Int32
	mux.HandleFunc("GET /gated", func(w http.ResponseWriter, r *http.Request) {
		open.Add(1)
		defer open.Add(-1)
		eventStream(w, r, inst, gate)
	})
	mux.HandleFunc("POST /gated/next", func(w http.ResponseWriter, r *http.Request) {
		select {
		case gate <- time.Now():
			fmt.Fprint(w, "sent")
		case <-time.After(5 * time.Second):
			http.Error(w, "no stream waiting", http.StatusConflict)
		}
	})
	mux.HandleFunc("GET /gated/open", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, open.Load()) })
	mux.HandleFunc("/echo-body", func(w http.ResponseWriter, r *http.Request) {
		// Streams the request body back line by line as it arrives.
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			fmt.Fprintf(w, "%s\n", sc.Text())
			_ = rc.Flush()
		}
	})
	mux.HandleFunc("/upgrade", func(w http.ResponseWriter, r *http.Request) {
		// A minimal Upgrade: after 101 the connection echoes lines.
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprint(brw, "echo: "+line)
			_ = brw.Flush()
		}
	})
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		sleeping.Add(1)
		defer sleeping.Add(-1)
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			fmt.Fprint(w, "slept")
		case <-r.Context().Done():
		}
	})
	mux.Handle("/", echo(inst))
	return mux
}

// eventStream writes numbered events, each flushed on its own, one more
// every time next fires, until the client goes away or the instance is
// evicted (a last "fin" event says so).
func eventStream(w http.ResponseWriter, r *http.Request, inst *sdk.Instance, next <-chan time.Time) {
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i := 0; ; i++ {
		fmt.Fprintf(w, "data: %d\n\n", i)
		if rc.Flush() != nil {
			return
		}
		select {
		case <-next:
		case <-r.Context().Done():
			return
		case <-inst.Context().Done():
			fmt.Fprint(w, "event: fin\ndata: evicted\n\n")
			_ = rc.Flush()
			return
		}
	}
}

// servePlainHTTP serves the counter host over plain loopback HTTP, no
// pinnedd involved: the baseline the data-plane benchmark compares against.
func servePlainHTTP() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h, _ := counter.Host().New(sdk.NewMemoryInstance("/counters", "bench"))
	fmt.Printf("listening %s\n", ln.Addr())
	_ = http.Serve(ln, h)
}

// runJob is /jobs' tray handler.
func runJob(ctx context.Context, run *sdk.Run) error {
	var job struct{ Name, Mode string }
	if err := json.Unmarshal(run.Items[0].Payload, &job); err != nil {
		return err
	}
	record("run %s resume=%v", job.Name, run.Resume)
	if err := run.Applied(ctx); err != nil {
		return err
	}
	record("applied %s", job.Name)
	if !run.Resume {
		switch job.Mode {
		case "crash":
			os.Exit(3)
		case "hang":
			<-ctx.Done() // until the process dies
			return ctx.Err()
		}
	}
	record("done %s", job.Name)
	return nil
}
