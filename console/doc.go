// Package console owns the admin console every node serves under Prefix:
// its pages and scripts, embedded in the binary and served with a strict
// Content-Security-Policy, and the node's short in-memory history of
// request, activation, placement and forward-failure counts (Series) that
// the console's charts draw.
//
// It never reads or changes the fleet itself and serves no data of its
// own: the pages call the node's existing JSON routes (/registry/*,
// /_pinned/*, /_raft/members) with the operator's bearer key, and those
// routes authorise every call as they do the CLI's. The static files are
// public; nothing in them is a secret. The history reaches a browser only
// inside GET /registry/stats (operator scope), through the node's own
// /_pinned/stats.
package console
