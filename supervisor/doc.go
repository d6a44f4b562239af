// Package supervisor owns this node's plugin processes and the instances
// inside them.
//
// Plugins: each distinct plugin binary runs as one go-plugin subprocess
// (gRPC control channel, instance HTTP over a private unix socket). The
// supervisor spawns it with a parent-death signal so it never outlives
// pinnedd, re-logs its stderr tagged with the plugin, notices its death at
// once through a held-open Events stream, restarts it with capped
// exponential backoff, and marks its namespaces degraded while it crash-loops
// so new activations go elsewhere (503 + Retry-After here). A hot swap
// starts a new process and winds the old one's instances down into it; with
// Spec.Watch it also follows a replaced binary on disk (binwatch.go). Every
// socket lives in the runtime dir, which Start clears of a dead
// predecessor's leftovers (runtimedir.go).
//
// Routes (routes.go): in hostname-aware mode each plugin serves its
// namespaces under one hostname, its ids in one env (Spec.Bind), so a node
// runs builds of one namespace side by side; an instance is keyed by
// (env, namespace, id), opened through the hostname whose plugin runs it,
// and stored under plugins.StateNamespace. Single mode is the empty
// hostname and env.
//
// Instances: the supervisor is the authority on which (env, namespace, id)
// is live on this node. An instance activates exactly once on its first request
// (concurrent first requests wait on one activation), counts its open
// requests and streams, and is evicted after its host's detached timeout
// with none open, or on drain and shutdown. Placement is not its business:
// callers pass the generation they resolved and learn of evictions through
// Config.OnEvicted.
//
// It must never decide placement, talk to the directory, or let a plugin
// process survive Stop.
package supervisor
