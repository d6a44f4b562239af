package supervisor

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
)

// storeServer is the Store service pinnedd serves each plugin over the
// go-plugin broker: the node's one pool, shared by every plugin, and the
// only way a plugin reaches durable state.
type storeServer struct {
	proto.UnimplementedStoreServer
	store  statestore.Store
	serves func(namespace string) bool
	env    string       // hostname-aware mode: the env the plugin's ids live in
	logger *slog.Logger // nil: says nothing
}

// key is where the plugin's instance (ns, id) is stored: under its env
// (plugins.StateNamespace), so preview builds with envs of their own never
// see each other's state.
func (s *storeServer) key(ns, id string) statestore.InstanceKey {
	return statestore.InstanceKey{Namespace: plugins.StateNamespace(s.env, ns), ID: id}
}

// NewStoreServer serves store as the plugin Store service, for the
// namespaces serves admits. The supervisor serves one per plugin; tests of
// plugin code can serve one of their own.
func NewStoreServer(store statestore.Store, serves func(namespace string) bool) proto.StoreServer {
	return &storeServer{store: store, serves: serves}
}

// serveStore starts the Store service for p on a new broker id of its
// connection conn and returns the id: p reaches the state of its own
// namespaces, in its env, and nothing else. The broker's server lives as
// long as the plugin's connection; calls from a dead plugin end with their
// context.
func (s *Supervisor) serveStore(p *pluginProc, conn *plugins.Conn, logger *slog.Logger) uint32 {
	if s.cfg.Store == nil || conn.Broker == nil {
		return 0
	}
	id := conn.Broker.NextId()
	srv := &storeServer{store: s.cfg.Store, serves: p.serves, env: p.spec.Bind.Env, logger: logger}
	go conn.Broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
		g := grpc.NewServer(append(opts, plugins.StoreServerOptions()...)...)
		proto.RegisterStoreServer(g, srv)
		return g
	})
	return id
}

func storeErr(err error) error {
	switch {
	case errors.Is(err, statestore.ErrFenced):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, statestore.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, statestore.ErrUnavailable):
		// Before the context cases: a store call that ran out of its own
		// deadline is an outage, not the caller's cancellation.
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		return status.Error(codes.Unavailable, err.Error())
	}
}

// Load implements proto.StoreServer.
func (s *storeServer) Load(ctx context.Context, req *proto.StoreLoadRequest) (*proto.StoreLoadResponse, error) {
	if !s.serves(req.Namespace) {
		return nil, status.Errorf(codes.PermissionDenied, "namespace %s is not served here", req.Namespace)
	}
	trays, err := s.store.Load(ctx, s.key(req.Namespace, req.Id), req.Generation)
	if err != nil {
		return nil, storeErr(err)
	}
	resp := &proto.StoreLoadResponse{Trays: make([]*proto.TrayData, 0, len(trays))}
	var marked, items int
	resume := false
	for _, t := range trays {
		td := &proto.TrayData{TrayNs: t.Key.NS, TrayId: t.Key.ID, Fields: t.Fields, Marked: t.Marked}
		for _, it := range t.Items {
			td.Items = append(td.Items, &proto.TrayItem{Seq: it.Seq, Payload: it.Payload, Applied: it.Applied})
			resume = resume || it.Applied
		}
		if len(t.Items) > 0 {
			marked++
			items += len(t.Items)
		}
		resp.Trays = append(resp.Trays, td)
	}
	if marked > 0 && s.logger != nil {
		// An activation that takes over unfinished work (after a crash,
		// on a survivor, after a swap): the operator's trace of who
		// resumed it. Activations with nothing pending say nothing.
		s.logger.Info("instance restored from store with unfinished work",
			"instance", Key{s.env, req.Namespace, req.Id}.String(), "generation", req.Generation,
			"trays", marked, "items", items, "resume", resume)
	}
	return resp, nil
}

// Commit implements proto.StoreServer.
func (s *storeServer) Commit(ctx context.Context, req *proto.StoreCommitRequest) (*proto.StoreCommitResponse, error) {
	if !s.serves(req.Namespace) {
		return nil, status.Errorf(codes.PermissionDenied, "namespace %s is not served here", req.Namespace)
	}
	muts := make([]statestore.Mutation, 0, len(req.Mutations))
	for _, m := range req.Mutations {
		tk := statestore.TrayKey{NS: m.TrayNs, ID: m.TrayId}
		switch op := m.Op.(type) {
		case *proto.StoreMutation_SetField:
			// An absent value deletes the field; present-but-empty sets it.
			muts = append(muts, statestore.SetField{Tray: tk, Name: op.SetField.Name, Value: op.SetField.Value})
		case *proto.StoreMutation_AppendItems:
			muts = append(muts, statestore.AppendItems{Tray: tk, Payloads: op.AppendItems.Payloads})
		case *proto.StoreMutation_MarkAppliedUpTo:
			muts = append(muts, statestore.MarkApplied{Tray: tk, UpTo: op.MarkAppliedUpTo})
		case *proto.StoreMutation_RemoveItemsUpTo:
			muts = append(muts, statestore.RemoveItems{Tray: tk, UpTo: op.RemoveItemsUpTo})
		case *proto.StoreMutation_DeleteTray:
			muts = append(muts, statestore.DeleteTray{Tray: tk})
		default:
			return nil, status.Error(codes.InvalidArgument, "mutation without an operation")
		}
	}
	res, err := s.store.Commit(ctx, s.key(req.Namespace, req.Id), req.Generation, muts)
	if err != nil {
		return nil, storeErr(err)
	}
	resp := &proto.StoreCommitResponse{}
	for _, seqs := range res.Seqs {
		resp.Seqs = append(resp.Seqs, &proto.Seqs{Seqs: seqs})
	}
	return resp, nil
}
