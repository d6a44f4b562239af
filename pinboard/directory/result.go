package directory

import (
	"encoding/binary"
	"fmt"
)

// Code is the outcome of one command. Values travel between nodes (a
// forwarded proposal's answer): never renumber them.
type Code byte

const (
	CodeOK                 Code = 0  // done (or nothing to do)
	CodeGranted            Code = 1  // Claim: the key is now placed on the candidate
	CodeExisting           Code = 2  // Claim: the candidate's session already holds it; Init: secret already set
	CodeHeld               Code = 3  // Claim: another live worker holds it; GiveBack: not this session's under that generation; Placement says who
	CodeIneligible         Code = 4  // Claim: the candidate cannot take placements; Reason says why
	CodeQuarantine         Code = 5  // Claim: cold-start quarantine; RemainingMs until it ends
	CodeConflict           Code = 6  // Claim: the key was granted earlier in this entry; retry in a new one
	CodeReregister         Code = 7  // Heartbeat: unknown client, stale session or lapsed lease; GiveBack: stale session
	CodeDuplicateAdvertise Code = 8  // Register: another live client holds the advertise URL
	CodeUnknownWorker      Code = 9  // Drain/Undrain/GiveBack: the client id never registered; DrainNode/UndrainNode: no known worker has the node id (API: 404)
	CodeNotFound           Code = 10 // Release/Deregister: nothing matched (already done, or not yours); GiveBack: no placement
	CodeUnknownCommand     Code = 11 // an ignorable command of an unknown type was skipped
	CodeInvalid            Code = 12 // the command's arguments are invalid; Reason says which
	CodeError              Code = 13 // undecodable, unknown non-ignorable, or stale index; nothing changed
	CodeBindingConflict    Code = 14 // RegisterRoutes: a route disagrees with a binding at the same or a higher epoch; Reason says which
	CodeTakeover           Code = 15 // ClaimRoute: a wind_down takeover is fenced; RemainingMs until the fence passes, Placement the holder's
)

var codeNames = [...]string{
	CodeOK: "ok", CodeGranted: "granted", CodeExisting: "existing", CodeHeld: "held",
	CodeIneligible: "ineligible", CodeQuarantine: "quarantine", CodeConflict: "conflict",
	CodeReregister: "reregister", CodeDuplicateAdvertise: "duplicate_advertise",
	CodeUnknownWorker: "unknown", CodeNotFound: "not_found",
	CodeUnknownCommand: "unknown_command", CodeInvalid: "invalid", CodeError: "error",
	CodeBindingConflict: "binding_conflict", CodeTakeover: "takeover",
}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", byte(c))
}

// Reasons a candidate is ineligible for a claim (Result.Reason with
// CodeIneligible).
const (
	ReasonUnknownWorker = "unknown worker"
	ReasonNotRegistered = "not registered"
	ReasonLeaseLapsed   = "lease lapsed"
	ReasonNamespace     = "namespace not served"
	ReasonDraining      = "draining"
	ReasonDegraded      = "degraded"
	ReasonUnconfirmed   = "not heard from since the election"
)

// Result is the answer to one command. Fields a command does not use stay
// zero; a Placement is present iff its Generation is non-zero (generations
// start above 0).
type Result struct {
	Code   Code
	Reason string

	Placement Placement // Claim: granted, existing or held; Release, GiveBack: the current one on a mismatch

	LeaseExpiry int64 // Register, Heartbeat: unix ms
	ExpiresInMs int64 // Register, Heartbeat: LeaseExpiry - Now, never negative
	Draining    bool  // Register, Heartbeat, DrainWorker, DrainNode: Drain is in force
	Drain       Drain
	Degraded    bool // Heartbeat

	RemainingMs int64 // Quarantine

	Duplicates []Key // Register: listed live ids this worker does not own

	Superseded []Route // Heartbeat: the worker's routes a higher epoch superseded; BindingConflict: the route refused

	WorkersForgotten  int // GC
	PlacementsDropped int // GC
	DrainsExpired     int // GC

	Results []Result // Batch, one per command
}

// HasPlacement reports whether r carries a placement.
func (r Result) HasPlacement() bool { return r.Placement.Generation != 0 }

const resultVersion byte = 1

// Result field tags. A field is written only when it is not zero, in tag
// order, and tagEnd closes every result body (so nested results need no
// length prefix).
const (
	tagEnd byte = iota
	tagReason
	tagPlacement
	tagLease
	tagDrain
	tagDegraded
	tagRemaining
	tagDuplicates
	tagGC
	tagResults
	tagDrainNode      // the node id of a node's drain (added after tagResults, so it comes last)
	tagPlacementRoute // the placement's hostname and fence (hostname-aware mode)
	tagSuperseded
	tagLast = tagSuperseded
)

// AppendResult appends the encoding of r to b.
func AppendResult(b []byte, r Result) []byte {
	return appendResultBody(append(b, resultVersion), r)
}

// EncodeResult returns the encoding of r, as Apply returns it.
func EncodeResult(r Result) []byte {
	return AppendResult(make([]byte, 0, 16+16*len(r.Results)), r)
}

func appendPlacement(b []byte, p Placement) []byte {
	b = appendKey(b, p.Key)
	b = appendString(b, p.Owner)
	b = appendString(b, p.OwnerSession)
	b = binary.AppendUvarint(b, p.Generation)
	return binary.AppendVarint(b, p.PlacedAt)
}

func appendDrain(b []byte, d Drain) []byte {
	b = appendString(b, d.ClientID)
	b = binary.AppendVarint(b, d.Deadline)
	b = appendBool(b, d.Cordon)
	return binary.AppendVarint(b, d.SetAt)
}

func appendResultBody(b []byte, r Result) []byte {
	b = append(b, byte(r.Code))
	if r.Reason != "" {
		b = appendString(append(b, tagReason), r.Reason)
	}
	if r.HasPlacement() {
		b = appendPlacement(append(b, tagPlacement), r.Placement)
	}
	if r.LeaseExpiry != 0 || r.ExpiresInMs != 0 {
		b = binary.AppendVarint(append(b, tagLease), r.LeaseExpiry)
		b = binary.AppendVarint(b, r.ExpiresInMs)
	}
	if r.Draining {
		b = appendDrain(append(b, tagDrain), r.Drain)
	}
	if r.Degraded {
		b = append(b, tagDegraded)
	}
	if r.RemainingMs != 0 {
		b = binary.AppendVarint(append(b, tagRemaining), r.RemainingMs)
	}
	if len(r.Duplicates) != 0 {
		b = appendKeys(append(b, tagDuplicates), r.Duplicates)
	}
	if r.WorkersForgotten != 0 || r.PlacementsDropped != 0 || r.DrainsExpired != 0 {
		b = binary.AppendUvarint(append(b, tagGC), uint64(r.WorkersForgotten))
		b = binary.AppendUvarint(b, uint64(r.PlacementsDropped))
		b = binary.AppendUvarint(b, uint64(r.DrainsExpired))
	}
	if len(r.Results) != 0 {
		b = binary.AppendUvarint(append(b, tagResults), uint64(len(r.Results)))
		for _, sub := range r.Results {
			b = appendResultBody(b, sub)
		}
	}
	if r.Draining && r.Drain.NodeID != "" {
		b = appendString(append(b, tagDrainNode), r.Drain.NodeID)
	}
	if r.HasPlacement() && (r.Placement.Hostname != "" || r.Placement.FenceUntil != 0) {
		b = appendString(append(b, tagPlacementRoute), r.Placement.Hostname)
		b = binary.AppendVarint(b, r.Placement.FenceUntil)
	}
	if len(r.Superseded) != 0 {
		b = appendRoutes(append(b, tagSuperseded), r.Superseded)
	}
	return append(b, tagEnd)
}

// DecodeResult parses the bytes Apply returned.
func DecodeResult(b []byte) (Result, error) {
	if len(b) == 0 {
		return Result{}, ErrMalformed
	}
	if b[0] != resultVersion {
		return Result{}, fmt.Errorf("%w: result version %d", ErrVersion, b[0])
	}
	d := decoder{b: b[1:]}
	r := decodeResultBody(&d, true)
	if err := d.done(); err != nil {
		return Result{}, err
	}
	return r, nil
}

// decodeResultBody reads one result up to and including its tagEnd.
func decodeResultBody(d *decoder, top bool) Result {
	r := Result{Code: Code(d.byte())}
	last := tagEnd
	for d.err == nil {
		tag := d.byte()
		if tag == tagEnd {
			return r
		}
		if tag <= last || tag > tagLast {
			d.fail() // one encoding per result: known tags, in order
			return r
		}
		last = tag
		switch tag {
		case tagReason:
			r.Reason = d.string()
		case tagPlacement:
			r.Placement = Placement{Key: d.key(), Owner: d.string(), OwnerSession: d.string(),
				Generation: d.uvarint(), PlacedAt: d.varint()}
		case tagLease:
			r.LeaseExpiry, r.ExpiresInMs = d.varint(), d.varint()
		case tagDrain:
			r.Draining = true
			r.Drain = Drain{ClientID: d.string(), Deadline: d.varint(), Cordon: d.bool(), SetAt: d.varint()}
		case tagDegraded:
			r.Degraded = true
		case tagRemaining:
			r.RemainingMs = d.varint()
		case tagDuplicates:
			r.Duplicates = d.keys()
		case tagGC:
			r.WorkersForgotten, r.PlacementsDropped, r.DrainsExpired = int(d.uvarint()), int(d.uvarint()), int(d.uvarint())
		case tagResults:
			if !top {
				d.fail() // batches do not nest
				return r
			}
			n := d.count(2)
			r.Results = make([]Result, n)
			for i := range r.Results {
				r.Results[i] = decodeResultBody(d, false)
			}
		case tagDrainNode:
			if !r.Draining {
				d.fail() // only with the drain it names
				return r
			}
			if r.Drain.NodeID = d.string(); r.Drain.NodeID == "" {
				d.fail() // written only when not empty
			}
		case tagPlacementRoute:
			if !r.HasPlacement() {
				d.fail() // only with the placement it belongs to
				return r
			}
			r.Placement.Hostname, r.Placement.FenceUntil = d.string(), d.varint()
			if r.Placement.Hostname == "" && r.Placement.FenceUntil == 0 {
				d.fail() // written only when not zero
			}
		case tagSuperseded:
			if r.Superseded = d.routes(); len(r.Superseded) == 0 {
				d.fail()
			}
		}
	}
	return r
}
