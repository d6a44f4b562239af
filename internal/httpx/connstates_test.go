package httpx

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A connection accepted before the server stopped accepting, whose request
// arrives while it stops, is answered: AwaitFirstRequests holds net/http's
// Shutdown (which drops a request it reads after it began) until the
// request came. Without the wait the client reads EOF.
func TestAwaitFirstRequestsBeforeShutdown(t *testing.T) {
	{
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var cs ConnStates
		srv := &http.Server{ConnState: cs.Track, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "answered")
		})}
		served := make(chan struct{})
		go func() { _ = srv.Serve(ln); close(served) }()

		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for cs.Count(http.StateNew) != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the connection never showed as new")
			}
			time.Sleep(time.Millisecond)
		}
		_ = ln.Close() // accepts no more; Serve returns
		<-served
		stopped := make(chan struct{})
		go func() {
			cs.AwaitFirstRequests(context.Background())
			_ = srv.Shutdown(context.Background())
			close(stopped)
		}()
		time.Sleep(50 * time.Millisecond) // the request is still on its way
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		got := ""
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			got = string(b)
		}
		c.Close()
		<-stopped
		if got != "answered" {
			t.Fatalf("a request that came as the server stopped: %q, %v", got, err)
		}
	}
}
