//go:build !linux

package sdnotify

import "errors"

// monotonicUsec: systemd runs only on Linux; elsewhere Reloading has no clock
// to report and says so.
func monotonicUsec() (uint64, error) { return 0, errors.ErrUnsupported }
