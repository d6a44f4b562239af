package e2e

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// The README's metric table is what a --dev agent exports: every metric it
// names is a family on GET /metrics with the labels it shows and each label
// value it lists, and every pinboard_* / pinned_* family exported is in the
// table.
func TestMetricsMatchREADME(t *testing.T) {
	t.Parallel()
	table := readmeMetrics(t)
	a := testutil.StartAgent(t, nil, "--dev")

	// Families with no labelled child exist only once something happened:
	// an activation and a request, an eviction, a plugin restart.
	if r := a.MustDo("POST", "/counters/alice/increment", ""); r.Code != http.StatusOK {
		t.Fatalf("increment: %d %s", r.Code, r.Body)
	}
	if r := a.MustDo("POST", "/registry/wind_down", `{"namespace":"/counters","id":"alice","deadline":0}`); r.Code != http.StatusOK {
		t.Fatalf("wind_down: %d %s", r.Code, r.Body)
	}
	// A refused request (a token no key has) counts as one.
	if r, err := testutil.Do(t.Context(), "GET", a.URL+"/_pinned/status", "", map[string]string{"Authorization": "Bearer not-a-key"}); err != nil || r.Code != http.StatusUnauthorized {
		t.Fatalf("status with an unknown token: %v %v", r.Code, err)
	}
	plugins := testutil.ChildrenOf(a.PID())
	if len(plugins) == 0 {
		t.Fatal("no plugin processes under the agent")
	}
	if err := syscall.Kill(plugins[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var exp exposition
	testutil.WaitFor(t, 30*time.Second, "an eviction and a plugin restart in /metrics", func() bool {
		exp = scrape(t, a)
		return exp.has("pinned_evictions_total") && exp.has("pinned_plugin_restarts_total")
	})

	for _, m := range table {
		if !exp.has(m.name) {
			t.Errorf("README names %s; /metrics has no such family", m.name)
			continue
		}
		for _, l := range m.labels {
			if !exp.labelNames(m.name)[l] {
				t.Errorf("README gives %s the label %q; /metrics shows %v", m.name, l, exp.labelNames(m.name))
			}
		}
		for _, v := range m.values {
			if !exp.hasValue(m.name, m.labels[0], v) {
				t.Errorf("README lists %s{%s=%q}; /metrics has no such series", m.name, m.labels[0], v)
			}
		}
	}
	for _, name := range exp.families {
		if !strings.HasPrefix(name, "pinboard_") && !strings.HasPrefix(name, "pinned_") {
			continue
		}
		if !slices.ContainsFunc(table, func(m readmeMetric) bool { return m.name == name }) {
			t.Errorf("/metrics exports %s; the README's metric table does not name it", name)
		}
	}
}

// readmeMetric is one metric of the README's table: its labels (as in
// `name{a,b}`) and, for the row's one labelled metric, the label values the
// row lists in backquotes.
type readmeMetric struct {
	name   string
	labels []string
	values []string
}

var (
	backquoted = regexp.MustCompile("`([^`]+)`")
	metricRef  = regexp.MustCompile(`^([a-z_]+)(?:\{([a-z_,]+)\})?$`)
	labelValue = regexp.MustCompile(`^[a-z][a-z-]*$`)
)

// readmeMetrics parses the table under "Metrics (`GET /metrics`)" in the
// README, up to "Not yet:".
func readmeMetrics(t *testing.T) []readmeMetric {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "Metrics (`GET /metrics`)")
	end := strings.Index(s, "Not yet:")
	if start < 0 || end < start {
		t.Fatal("README has no metric table between \"Metrics (`GET /metrics`)\" and \"Not yet:\"")
	}
	var out []readmeMetric
	for _, line := range strings.Split(s[start:end], "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a row naming metrics
		}
		var row []readmeMetric
		labelled := -1
		for _, ref := range backquoted.FindAllStringSubmatch(cells[1], -1) {
			m := metricRef.FindStringSubmatch(ref[1])
			if m == nil {
				t.Fatalf("README metric table: %q is not a metric name", ref[1])
			}
			rm := readmeMetric{name: m[1]}
			if m[2] != "" {
				rm.labels = strings.Split(m[2], ",")
				labelled = len(row)
			}
			row = append(row, rm)
		}
		for _, v := range backquoted.FindAllStringSubmatch(cells[2], -1) {
			if !labelValue.MatchString(v[1]) {
				t.Fatalf("README metric table: %q in %q is not a label value", v[1], line)
			}
			if labelled < 0 || len(row[labelled].labels) != 1 {
				t.Fatalf("README metric table: row %q lists label values but has no metric with exactly one label", line)
			}
			row[labelled].values = append(row[labelled].values, v[1])
		}
		out = append(out, row...)
	}
	if len(out) < 10 {
		t.Fatalf("README metric table parsed to %d metrics: %+v", len(out), out)
	}
	return out
}

// exposition is one scrape of /metrics in the text format.
type exposition struct {
	families []string
	samples  []sample
}

type sample struct {
	name   string
	labels map[string]string
}

var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func scrape(t *testing.T, a *testutil.Agent) exposition {
	t.Helper()
	r := a.MustDo("GET", "/metrics", "")
	if r.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", r.Code, r.Body)
	}
	var e exposition
	sc := bufio.NewScanner(strings.NewReader(r.Body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			e.families = append(e.families, strings.Fields(rest)[0])
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			s.name = line[:i]
			if line[i] == '{' {
				for _, m := range labelPair.FindAllStringSubmatch(line[i:strings.LastIndexByte(line, '}')+1], -1) {
					s.labels[m[1]] = m[2]
				}
			}
		}
		e.samples = append(e.samples, s)
	}
	return e
}

func (e exposition) has(family string) bool { return slices.Contains(e.families, family) }

// of reports whether sample s belongs to family (a histogram's or a
// summary's series carry suffixes).
func (s sample) of(family string) bool {
	rest, ok := strings.CutPrefix(s.name, family)
	return ok && (rest == "" || rest == "_bucket" || rest == "_sum" || rest == "_count")
}

// labelNames are the labels family's series carry, without the
// histogram's le.
func (e exposition) labelNames(family string) map[string]bool {
	names := map[string]bool{}
	for _, s := range e.samples {
		if s.of(family) {
			for k := range s.labels {
				if k != "le" && k != "quantile" {
					names[k] = true
				}
			}
		}
	}
	return names
}

func (e exposition) hasValue(family, label, value string) bool {
	return slices.ContainsFunc(e.samples, func(s sample) bool { return s.of(family) && s.labels[label] == value })
}
