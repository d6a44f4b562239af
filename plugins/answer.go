package plugins

import "net/http"

// Answer is what an upstream's answer means to the hop that forwarded the
// request (a front door to the owner's node, an owner to its plugin).
type Answer uint8

// Answers.
const (
	// AnswerServed: an answer for the client, whatever its status.
	AnswerServed Answer = iota
	// AnswerRefused: the owner ran nothing and takes no new activation
	// (lease unhealthy, draining, the namespace degraded there): release the placement and retry on
	// another worker.
	AnswerRefused
	// AnswerMisdirected: the owner does not hold the placement under the
	// attested generation, or not under the session the attestation was
	// signed for: ask the leader where it is, and retry.
	AnswerMisdirected
	// AnswerInactive: the plugin does not hold the instance (its process
	// restarted): the owner drops its record and the client retries.
	AnswerInactive
)

// ClassifyAnswer is the one rule for reading an answer's status and
// HeaderRefusal value, on every path that forwards.
func ClassifyAnswer(status int, refusal string) Answer {
	switch {
	case refusal == "":
		return AnswerServed
	case status == http.StatusServiceUnavailable && (refusal == RefusalLeaseUnhealthy || refusal == RefusalDraining || refusal == RefusalDegraded):
		return AnswerRefused
	case status == http.StatusMisdirectedRequest && refusal == RefusalNotOwner,
		status == http.StatusForbidden && refusal == RefusalAttestation:
		return AnswerMisdirected
	case status == http.StatusServiceUnavailable && refusal == RefusalInactive:
		return AnswerInactive
	}
	return AnswerServed
}
