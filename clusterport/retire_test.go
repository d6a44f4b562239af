package clusterport

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A CA's retirement ends the HTTP connections its certificates opened
// before: an idle one is closed at once, one carrying a request is
// answered and closed after the answer; the raft side closes outright.
func TestSweepUntrustedRetiresHTTPConnections(t *testing.T) {
	old, next := testutil.NewCA(t, "old"), testutil.NewCA(t, "next")
	server := testutil.Identity(t, old, "server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st := New(ln, ln.Addr(), server, Options{Admit: func(string) error { return nil }, MemberHost: func(string) bool { return true }, Logger: testLogger()})
	defer st.Close()
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	st.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held <- struct{}{}
			<-hold
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer st.StopHTTP(context.Background(), false)

	// The member dials under the old CA, over two clients (one connection
	// each); their raw connections are kept so that the test sees which
	// ones the server closed.
	member := testutil.Identity(t, old, "member")
	base := "https://" + ln.Addr().String()
	type client struct {
		*http.Client
		mu    sync.Mutex
		conns []net.Conn
	}
	newClient := func() *client {
		c := &client{}
		tr := &http.Transport{TLSClientConfig: member.ClientConfig(ALPNHTTP),
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					c.mu.Lock()
					c.conns = append(c.conns, raw)
					c.mu.Unlock()
				}
				return raw, err
			}}
		t.Cleanup(tr.CloseIdleConnections)
		c.Client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
		return c
	}
	get := func(c *client, path string) (*http.Response, error) {
		resp, err := c.Get(base + path)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	idler, worker := newClient(), newClient()
	if resp, err := get(idler, "/idle"); err != nil || resp.Close {
		t.Fatalf("before the rotation: %v %+v", err, resp)
	}
	// The other connection is busy with a request when the CA retires.
	busy := make(chan *http.Response, 1)
	go func() {
		resp, err := get(worker, "/hold")
		if err != nil {
			t.Errorf("the request under way when the CA retired: %v", err)
		}
		busy <- resp
	}()
	<-held

	// The cluster trusts the next CA alone: the old one is retired.
	nextServer := testutil.Identity(t, next, "server")
	_, certPEM, keyPEM := nextServer.Leaf()
	if err := server.Set(next.CertPEM(), certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	st.SweepUntrusted(server.Trusts)

	// The idle connection is closed by the server.
	idler.mu.Lock()
	idle := idler.conns[0]
	idler.mu.Unlock()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the idle connection is still open: %v", err)
	}
	// The busy one is answered, and closed after the answer.
	close(hold)
	if resp := <-busy; resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the request under way was not answered: %+v", resp)
	}
	// Its client's next request cannot ride it: a new connection is
	// needed, and refused under the retired CA.
	if resp, err := get(worker, "/idle"); err == nil {
		t.Fatalf("the retired connection served another request: %+v", resp)
	}
	// And nothing new gets in under the old CA.
	if _, err := get(newClient(), "/idle"); err == nil {
		t.Fatal("a new connection under the retired CA was served")
	}
}
