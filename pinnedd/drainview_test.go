package main

import (
	"testing"
	"time"
)

// A drain's deadline is when busy instances are evicted, not when the
// drain ends: status says so, before and after it passes, and dates a
// deadline that is not today's.
func TestDrainViewText(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.Local)
	timed := func(at time.Time, sources ...string) drainView {
		return drainView{Draining: true, DrainSources: sources, DrainDeadline: at.UnixMilli()}
	}
	for _, c := range []struct {
		d    drainView
		want string
	}{
		{drainView{}, ""},
		{drainView{Draining: true, DrainSources: []string{"operator"}, Cordoned: true}, ", draining (operator, cordoned)"},
		{timed(now.Add(30*time.Second), "local"), ", draining (local, busy instances evicted at 12:00:30, lasts until undrain)"},
		{timed(now.Add(-time.Minute), "local"), ", draining (local, busy instances evicted since 11:59:00, lasts until undrain)"},
		{timed(now.Add(-48*time.Hour), "local", "operator"), ", draining (local, operator, busy instances evicted since 2026-12-01 12:00:00, lasts until undrain)"},
	} {
		if got := c.d.text(", ", now); got != c.want {
			t.Errorf("text(%+v)\n got %q\nwant %q", c.d, got, c.want)
		}
	}
}
