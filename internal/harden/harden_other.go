//go:build !linux

package harden

func nonDumpable() error { return nil }
