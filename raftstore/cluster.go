package raftstore

import (
	"context"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/clusterport"
)

// The log as the cluster port (Config.Cluster) follows it and its CA records itself in it.

// configured tells the cluster port the members, at every committed configuration. The configuration is Raft's
// latest (appended, if not yet committed), not c: a restarted node's state machine replays
// every configuration of its log, and an old one (before a node joined) must neither drop
// current members from the checks nor cut their connections, the current leader's among them.
func (l clusterLog) configured(c raft.Configuration) {
	if l.s.cfg.Cluster == nil {
		return
	}
	select {
	case <-l.s.raftUp: // s.raft is set
		c = l.s.raft.GetConfiguration().Configuration() // no wait: raft keeps it at hand
	default:
	}
	l.s.cfg.Cluster.Configured(servers(c.Servers))
}

func servers(srvs []raft.Server) []clusterport.Server {
	out := make([]clusterport.Server, len(srvs))
	for i, srv := range srvs {
		out[i] = clusterport.Server{ID: string(srv.ID), Addr: string(srv.Address)}
	}
	return out
}

// clusterLog is the log as the cluster port follows it and the cluster CA records itself in it.
type clusterLog struct{ s *Store }

func (l clusterLog) Record(ctx context.Context, op clusterport.CAOp, certPEM, keyPEM string) error {
	_, err := l.s.applyLocal(ctx, encodeMeta(metaCommand{Op: string(op), CACert: certPEM, CAKey: keyPEM}))
	return err
}

func (l clusterLog) Servers(ctx context.Context) ([]clusterport.Server, error) {
	srvs, err := l.s.members.configuration(ctx)
	return servers(srvs), err
}

func (l clusterLog) Configuration() ([]clusterport.Server, error) {
	f := l.s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return servers(f.Configuration().Servers), nil
}

func (l clusterLog) Changes() <-chan struct{} { return l.s.lead.changes() }
