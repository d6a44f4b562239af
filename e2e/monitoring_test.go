package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// The files under monitoring/ that operators load into Prometheus and Grafana.
var (
	rulesFile     = filepath.Join("..", "monitoring", "pinnedd.rules.yml")
	rulesTestFile = filepath.Join("..", "monitoring", "pinnedd.rules.test.yml")
	dashboardFile = filepath.Join("..", "monitoring", "grafana-fleet.json")
)

// promtool runs promtool with args and fails the test on a non-zero exit. A machine without
// promtool fails the test too (.ci/run installs it): the rules are only as good as their check.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (apt-get install prometheus; .ci/run does): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// The alert rules are valid and do what their unit tests say (promtool), and every metric,
// and every label value they or the Grafana dashboard select, is one a running node exports.
func TestMonitoringRulesAndDashboard(t *testing.T) {
	t.Parallel()
	promtool(t, "check", "rules", rulesFile)
	promtool(t, "test", "rules", rulesTestFile)

	exprs := ruleExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("%s: %d rule expressions", rulesFile, len(exprs))
	}
	dash := dashboardExprs(t)
	if len(dash) < 10 {
		t.Fatalf("%s: %d panel queries", dashboardFile, len(dash))
	}

	// A node with every family present: an activation, a request and an eviction.
	a := testutil.StartAgent(t, nil, "--dev")
	if r := a.MustDo("POST", "/counters/alice/increment", ""); r.Code != http.StatusOK {
		t.Fatalf("increment: %d %s", r.Code, r.Body)
	}
	if r := a.MustDo("POST", "/registry/wind_down", `{"namespace":"/counters","id":"alice","deadline":0}`); r.Code != http.StatusOK {
		t.Fatalf("wind_down: %d %s", r.Code, r.Body)
	}
	var exp exposition
	testutil.WaitFor(t, 30*time.Second, "an eviction in /metrics", func() bool {
		exp = scrape(t, a)
		return exp.has("pinned_evictions_total")
	})

	for _, e := range append(exprs, dash...) {
		for _, ref := range promRefs(e) {
			if ref.name == "up" { // Prometheus's own, per scrape target
				continue
			}
			if !slices.ContainsFunc(exp.samples, func(s sample) bool { return s.name == ref.name }) {
				t.Errorf("%q uses %s; /metrics has no such series", e, ref.name)
				continue
			}
			for _, m := range ref.matchers {
				for _, v := range m.values {
					if !exp.hasValue(strings.TrimSuffix(strings.TrimSuffix(ref.name, "_bucket"), "_count"), m.label, v) {
						t.Errorf("%q selects %s{%s=%q}; /metrics has no such series", e, ref.name, m.label, v)
					}
				}
			}
		}
	}
}

// ruleExprs are the expr: lines of the rules file (each rule's expression is on one line).
func ruleExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			out = append(out, strings.TrimSpace(e))
		}
	}
	return out
}

// dashboardExprs are the PromQL queries of the dashboard: its panels' targets and its
// variables' queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			out = append(out, v.Definition)
		}
	}
	return out
}

type promRef struct {
	name     string
	matchers []labelMatcher
}

type labelMatcher struct {
	label  string
	values []string // an =~ alternation's values, or the one value of =
}

var (
	selectorRe = regexp.MustCompile(`\b((?:pinned|pinboard)_[a-z_]+|up)\b(\{[^}]*\})?`)
	matcherRe  = regexp.MustCompile(`([a-z_]+)\s*(=~|=)\s*"([^"]*)"`)
)

// promRefs are the metric names an expression selects, with their label matchers on fixed
// values (job, set by the scraper, and Grafana's $variables are not pinnedd's to export).
func promRefs(expr string) []promRef {
	var out []promRef
	for _, m := range selectorRe.FindAllStringSubmatch(expr, -1) {
		ref := promRef{name: m[1]}
		for _, mm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
			if mm[1] == "job" || strings.Contains(mm[3], "$") {
				continue
			}
			vals := []string{mm[3]}
			if mm[2] == "=~" {
				vals = strings.Split(mm[3], "|")
			}
			ref.matchers = append(ref.matchers, labelMatcher{label: mm[1], values: vals})
		}
		out = append(out, ref)
	}
	return out
}
