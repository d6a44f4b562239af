package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1024": 1024, "16MiB": 16 << 20, "16 mib": 16 << 20, "1KiB": 1 << 10, "2GiB": 2 << 30, "512B": 512,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5MiB", "MiB", "16MB", "10TiB", "9999999999GiB", "x"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}
