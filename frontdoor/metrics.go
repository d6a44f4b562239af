package frontdoor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
)

// Label values of the front door's labelled counters. Each list is every
// value its counter can take, and each is exported at 0 from the start, so
// an alert such as increase(pinboard_forward_failures_total{outcome=
// "unreachable"}[5m]) has a series to evaluate before the first failure.
// The README's metric table names the same values (a test compares them).
const (
	// pinboard_placement_resolutions_total{outcome}
	outcomePlaced      = "placed"      // a claim placed the id on a worker
	outcomeForwarded   = "forwarded"   // served by the owner on another node
	outcomeLocal       = "local"       // served on this node
	outcomeQuarantined = "quarantined" // refused: the directory's cold-start quarantine
	outcomeNoBackends  = "no-backends" // refused: no live, undrained worker serves the namespace
	outcomeStarting    = "starting"    // refused: this node's replica has not caught up since it started
	outcomeError       = "error"       // the directory could not answer

	// pinboard_forward_failures_total{outcome}
	outcomeUnreachable = httpx.OutcomeUnreachable // nothing reached the owner's node: 503, it did not run
	outcomeUnknown     = httpx.OutcomeUnknown     // sent, then cut or timed out before an answer: 504, it may have run
	outcomeRefused     = "refused"                // the owner refused in-band (draining, lease unhealthy)
	outcomeMisdirected = "misdirected"            // the owner does not hold the placement our replica named
	outcomeCanceled    = "canceled"               // the client went away first
	outcomeTooLarge    = httpx.OutcomeTooLarge    // the client's body ran over --max-body-size on its way: 413

	// pinboard_relayed_streams_ended_total{reason}: relay.Reason's names, and
	relayEndRefused = "refused" // the relay loop would not take the stream
)

var (
	resolutionOutcomes = []string{outcomePlaced, outcomeForwarded, outcomeLocal, outcomeQuarantined, outcomeNoBackends, outcomeStarting, outcomeError}
	forwardOutcomes    = []string{outcomeUnreachable, outcomeUnknown, outcomeRefused, outcomeMisdirected, outcomeCanceled, outcomeTooLarge}
	relayEndReasons    = []string{relay.Complete.String(), relay.ClientGone.String(), relay.UpstreamFailed.String(), relay.Shutdown.String(), relayEndRefused}
)

// newCounterVec is a counter with one label whose every value in values
// exists, at 0, from the start.
func newCounterVec(name, help, label string, values []string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, val := range values {
		v.WithLabelValues(val)
	}
	return v
}
