// Package harden owns the process-wide protections pinnedd applies to
// itself at start. It must never change anything but pinnedd's own process
// attributes.
package harden

// NonDumpable makes this process non-dumpable: no core dumps, and a process
// of the same user (a plugin run as pinnedd's user) can neither ptrace it
// nor open its /proc/<pid>/environ, mem or auxv, which the kernel then gives
// to root. pinnedd's own reads of /proc/self (stat, statm, status, fd,
// limits) still work; its own environ does not, unless it runs as root.
// It is a no-op where the platform has no such setting.
func NonDumpable() error { return nonDumpable() }
