// Package storegrpc serves a state store to a test over real gRPC on
// loopback, as pinnedd serves its store to a plugin, so SDK and host tests
// run against the real Store service rather than a stand-in. Test code only.
package storegrpc

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Client serves store (every namespace allowed) until the test ends and
// returns a client for it.
func Client(t testing.TB, store statestore.Store) proto.StoreClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(plugins.StoreServerOptions()...)
	proto.RegisterStoreServer(g, supervisor.NewStoreServer(store, func(string) bool { return true }))
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(),
		append(plugins.StoreDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return proto.NewStoreClient(conn)
}
