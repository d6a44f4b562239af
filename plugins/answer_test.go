package plugins

import (
	"net/http"
	"testing"
)

// The one rule for what an answer means to the hop that forwarded it: an
// in-band refusal counts only with the status it belongs to, so a host
// that sets the header on an ordinary answer is served as it answered.
func TestClassifyAnswer(t *testing.T) {
	for _, c := range []struct {
		status  int
		refusal string
		want    Answer
	}{
		{http.StatusOK, "", AnswerServed},
		{http.StatusServiceUnavailable, "", AnswerServed},
		{http.StatusServiceUnavailable, RefusalDraining, AnswerRefused},
		{http.StatusServiceUnavailable, RefusalLeaseUnhealthy, AnswerRefused},
		{http.StatusServiceUnavailable, RefusalDegraded, AnswerRefused},
		{http.StatusMisdirectedRequest, RefusalNotOwner, AnswerMisdirected},
		// An owner that re-registered a moment ago: the forwarder signed
		// for the session it had; it asks the leader again.
		{http.StatusForbidden, RefusalAttestation, AnswerMisdirected},
		{http.StatusServiceUnavailable, RefusalInactive, AnswerInactive},
		{http.StatusOK, RefusalDraining, AnswerServed},
		{http.StatusForbidden, RefusalNotOwner, AnswerServed},
		{http.StatusForbidden, "", AnswerServed},
		{http.StatusOK, RefusalAttestation, AnswerServed},
	} {
		if got := ClassifyAnswer(c.status, c.refusal); got != c.want {
			t.Errorf("ClassifyAnswer(%d, %q) = %d, want %d", c.status, c.refusal, got, c.want)
		}
	}
}
