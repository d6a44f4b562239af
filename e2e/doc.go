// Package e2e holds the end-to-end tests: real pinnedd processes, real
// plugin subprocesses, real HTTP, driven the way the README and its
// tutorials drive them. There is no non-test code here.
package e2e
