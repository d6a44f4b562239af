// Package statestore owns the durable state of pinnedd instances: the trays of each
// (namespace, id) — their persistent fields and their queues of work items — and the fence that
// keeps a stale activation from writing over its successor.
//
// Every write carries the placement generation of the activation making it. The store keeps the
// newest generation seen per instance and refuses older ones with [ErrFenced], so a paused or
// partitioned former owner can never change what the new owner reads or writes. An activation
// calls [Store.Fence] (or [Store.Load], which fences too) before anything else.
//
// Fences of instances that never wrote are collected ([Store.CollectFences]), so the ids
// strangers name do not leave state for ever; a store-wide floor then refuses the generations
// those fences refused. A fence is dropped only when no placement that may still write can
// need it: see DESIGN.md, "Collecting fences".
//
// The package defines the model, the [Store] contract, the input limits and the sentinel errors.
// The implementations live in subpackages (memstore, boltstore, pgstore) and all pass the
// conformance suite in storetest.
//
// It must never know about plugins, HTTP, Raft or placements: generations are opaque growing
// numbers to it, payloads and field values are opaque bytes. It must never apply part of a
// Commit, never reuse a sequence number, and never let a write with an older generation through.
//
// See DESIGN.md in this directory for the reasoning.
package statestore
