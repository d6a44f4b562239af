package hop

import (
	"strings"
	"testing"
)

// The intervals the table prints, against values worked by hand.
func TestIntervals(t *testing.T) {
	a := &row{roundRPS: []float64{110, 100, 90}}
	b := &row{roundRPS: []float64{100, 100, 100}}
	if got, want := ratioCI(a, b), "geometric mean 99.7%, 95% CI 77.7–127.9%"; got != want {
		t.Errorf("ratioCI = %q, want %q", got, want)
	}
	if got, want := diffCI([]float64{10, 20, 30}, []float64{0, 0, 0}), "mean +20 µs, 95% CI -5 to +45 µs"; !strings.HasSuffix(got, want) {
		t.Errorf("diffCI = %q, want it to end %q", got, want)
	}
	if got := ratioCI(&row{roundRPS: []float64{1, 2}}, b); !strings.Contains(got, "too few") {
		t.Errorf("two rounds: %q", got)
	}
	for df, want := range map[int]float64{1: 12.706, 7: 2.365, 20: 2.086, 30: 2.04, 60: 2.0} {
		if got := tCrit95(df); got < want-0.005 || got > want+0.005 {
			t.Errorf("tCrit95(%d) = %.3f, want %.3f", df, got, want)
		}
	}
}
