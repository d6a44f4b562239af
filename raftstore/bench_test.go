package raftstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkApply measures committed entries per second through Store.Apply: on one node and on
// three (leader, or a follower that forwards over HTTP), with 1 and 64 concurrent writers, with
// raft's BatchApplyCh on and off. Each entry is a 128-byte command; each commit is fsynced to
// raft-boltdb on every voter.
//
//	go test -run '^$' -bench BenchmarkApply -benchtime 2s ./raftstore/
func BenchmarkApply(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, batch := range []bool{true, false} {
			b.Run(fmt.Sprintf("nodes=%d/batchapplych=%v", nodes, batch), func(b *testing.B) {
				// Production timing (raft's defaults), not the tests' short timeouts.
				cluster := newClusterSM(b, nodes, func(c *Config) {
					c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout, c.CommitTimeout = 0, 0, 0, 0
					c.BatchApplyCh = batch
				},
					func() *listSM { return &listSM{countOnly: true} })
				leader := leaderOf(b, cluster)
				targets := []struct {
					name string
					n    *testNode
				}{{"leader", leader}}
				if nodes > 1 && !batch {
					for _, n := range cluster {
						if n != leader {
							waitLeader(b, n)
							targets = append(targets, struct {
								name string
								n    *testNode
							}{"follower", n})
							break
						}
					}
				}
				for _, tg := range targets {
					for _, writers := range []int{1, 64} {
						b.Run(fmt.Sprintf("via=%s/writers=%d", tg.name, writers), func(b *testing.B) {
							benchWriters(b, tg.n, writers)
						})
					}
				}
			})
		}
	}
}

func benchWriters(b *testing.B, n *testNode, writers int) {
	cmd := make([]byte, 128)
	ctx := context.Background()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if _, err := n.s.Apply(ctx, cmd); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("after %d entries: %v", next.Load(), err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}
