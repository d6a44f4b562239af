package directory

import (
	"encoding/binary"
	"fmt"
)

// FormatVersion is the command envelope version this package writes and
// reads. A new version is needed when an existing command's payload changes;
// a new command gets a new CommandType instead.
const FormatVersion byte = 1

// IgnorableFlag, set in a command's type byte, tells a node that does not
// know the type to skip the command (CodeUnknownCommand) rather than fail it
// (CodeError). See the package documentation for the policy.
const IgnorableFlag byte = 0x80

// CommandType identifies a command in the envelope. Values are part of the
// log format: never renumber or reuse them.
type CommandType byte

const (
	TypeInit       CommandType = 1
	TypeRegister   CommandType = 2
	TypeHeartbeat  CommandType = 3
	TypeDeregister CommandType = 4
	TypeClaim      CommandType = 5
	TypeRelease    CommandType = 6
	TypeDrain      CommandType = 7
	TypeUndrain    CommandType = 8
	TypeGC         CommandType = 9
	TypeBatch      CommandType = 10
	TypeGiveBack   CommandType = 11
	// Added after the first release: a node that does not know them fails
	// them (CodeError), so a proposer emits them once every node knows them.
	TypeDrainNode   CommandType = 12
	TypeUndrainNode CommandType = 13
	TypeRenewLeases CommandType = 14
	TypeReseal      CommandType = 15
	// Hostname-aware mode: proposed only by a fleet started with it, which
	// every node must know (they are not ignorable: skipping one diverges).
	TypeRegisterRoutes CommandType = 16
	TypeClaimRoute     CommandType = 17
)

// Command is one directory command. The set is closed: the concrete types in
// this file, plus Opaque for types this version does not know.
type Command interface {
	Type() CommandType
	appendPayload(b []byte) []byte
}

// Init sets the cluster secret (the attestation key) once; the proposer
// draws the random bytes. Later Inits are no-ops that answer CodeExisting.
type Init struct {
	Secret []byte
}

// Reseal records the cluster secret again, sealed anew (under the token
// that replaces the one it was sealed with): the same secret, so every key
// derived from it stays. Without a secret recorded it is CodeInvalid.
type Reseal struct {
	Secret []byte
}

// Register creates or replaces a worker's session. LiveIDs lists the ids the
// process is running; those it no longer owns come back as Duplicates.
type Register struct {
	ClientID     string
	SessionID    string
	NodeID       string
	AdvertiseURL string
	Namespaces   []string
	Headroom     int64
	TTLMs        int64
	Now          int64
	LiveIDs      []Key
	Draining     bool // see Heartbeat.Draining
}

// Heartbeat renews the lease of the worker's current session. ProbeOK is the
// outcome of the challenge probe the proposer ran; false marks the worker
// degraded (the lease is renewed all the same).
type Heartbeat struct {
	ClientID  string
	SessionID string
	Now       int64
	TTLMs     int64
	Headroom  int64
	ProbeOK   bool
	// Draining: the worker drains by itself (SIGTERM, a local `pinnedd
	// drain`): new placements skip it, as they skip an operator drain.
	Draining bool
}

// Deregister ends the worker's session and drops its placements. The worker
// stays known (and its drain record stays) until GC.
type Deregister struct {
	ClientID  string
	SessionID string
}

// Claim asks for Key to be placed on ClientID, the candidate the proposer
// chose. QuarantineMs is the cold-start quarantine (one lease TTL).
type Claim struct {
	Key          Key
	ClientID     string
	Now          int64
	QuarantineMs int64
}

// Release removes the placement of Key iff ClientID owns it with Generation.
type Release struct {
	Key        Key
	ClientID   string
	Generation uint64
}

// GiveBack is a worker giving back one id (POST /registry/release): it
// removes the placement of Key iff ClientID's current session is SessionID
// and it holds Key under Generation. Unlike Release (the front door's and
// the node's own release, which knows no session) it checks the session in
// the same step, so a worker acting on a session the directory replaced is
// told to re-register instead of dropping what its new session holds.
type GiveBack struct {
	Key        Key
	ClientID   string
	SessionID  string
	Generation uint64
}

// DrainWorker sets an operator drain on a known client id: a deadline in unix
// ms (the proposer turns the request's relative seconds into it), or a cordon.
type DrainWorker struct {
	ClientID string
	Deadline int64
	Cordon   bool
	Now      int64
}

// UndrainWorker removes the drain record of a client id.
type UndrainWorker struct {
	ClientID string
}

// DrainNode sets an operator drain on a node id: it applies to every
// worker that registers with that node id, so it survives the node's
// restart (a new process registers under a new client id). A drain of a
// client id (DrainWorker) applies to that one process only. The node id
// must be known: some worker the directory knows registered with it, or
// it already has a drain record.
type DrainNode struct {
	NodeID   string
	Deadline int64 // unix ms; ignored with Cordon
	Cordon   bool
	Now      int64
}

// UndrainNode removes the drain record of a node id, and those of the
// client ids of the workers the directory knows on that node: an undrained
// node takes placements again, whichever way it was drained.
type UndrainNode struct {
	NodeID string
}

// RenewLeases is a new leader's first command of its term: it forgives
// the leaderless gap. Every worker whose lease was live at the directory's
// clock (the latest Now of any command applied before it: when the former
// leader last committed) gets a fresh lease of TTLMs from Now, as a
// heartbeat would give it, unless its session is revoked or it registered
// on FormerLeader, the node id that led before the election: its workers
// keep their lease as it was and take no new placements until their own
// heartbeat or registration lands (Worker.Unconfirmed). See the package
// doc, "Leases".
type RenewLeases struct {
	Now          int64
	TTLMs        int64
	FormerLeader string
}

// GC forgets workers whose lease lapsed more than WorkerRetentionMs before
// Now (DefaultWorkerRetention when 0), with their placements, and drops timed
// drains DrainRetention past their deadline.
type GC struct {
	Now               int64
	WorkerRetentionMs int64
}

// Batch applies its commands in order within one log entry (group commit).
// Batches do not nest.
type Batch struct {
	Commands []Command
}

// Opaque is a command of a type this version does not know, kept as read so
// it can be skipped (ignorable) or failed, and re-encoded unchanged.
type Opaque struct {
	Version   byte        // envelope version it came in; 0 means FormatVersion
	Code      CommandType // the type byte without IgnorableFlag
	Ignorable bool
	Payload   []byte
}

func (Init) Type() CommandType           { return TypeInit }
func (Register) Type() CommandType       { return TypeRegister }
func (Heartbeat) Type() CommandType      { return TypeHeartbeat }
func (Deregister) Type() CommandType     { return TypeDeregister }
func (Claim) Type() CommandType          { return TypeClaim }
func (Release) Type() CommandType        { return TypeRelease }
func (DrainWorker) Type() CommandType    { return TypeDrain }
func (UndrainWorker) Type() CommandType  { return TypeUndrain }
func (GC) Type() CommandType             { return TypeGC }
func (Batch) Type() CommandType          { return TypeBatch }
func (GiveBack) Type() CommandType       { return TypeGiveBack }
func (DrainNode) Type() CommandType      { return TypeDrainNode }
func (UndrainNode) Type() CommandType    { return TypeUndrainNode }
func (RenewLeases) Type() CommandType    { return TypeRenewLeases }
func (Reseal) Type() CommandType         { return TypeReseal }
func (RegisterRoutes) Type() CommandType { return TypeRegisterRoutes }
func (ClaimRoute) Type() CommandType     { return TypeClaimRoute }
func (o Opaque) Type() CommandType       { return o.Code }

func (c Init) appendPayload(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(c.Secret)))
	return append(b, c.Secret...)
}

func (c Reseal) appendPayload(b []byte) []byte { return Init(c).appendPayload(b) }

func (c Register) appendPayload(b []byte) []byte {
	b = appendString(b, c.ClientID)
	b = appendString(b, c.SessionID)
	b = appendString(b, c.NodeID)
	b = appendString(b, c.AdvertiseURL)
	b = appendStrings(b, c.Namespaces)
	b = binary.AppendVarint(b, c.Headroom)
	b = binary.AppendVarint(b, c.TTLMs)
	b = binary.AppendVarint(b, c.Now)
	b = appendKeys(b, c.LiveIDs)
	return appendBool(b, c.Draining)
}

func (c RegisterRoutes) appendPayload(b []byte) []byte {
	return appendRoutes(c.Register.appendPayload(b), c.Routes)
}

func (c ClaimRoute) appendPayload(b []byte) []byte {
	b = appendString(c.Claim.appendPayload(b), c.Hostname)
	return binary.AppendVarint(b, c.TTLMs)
}

func (c Heartbeat) appendPayload(b []byte) []byte {
	b = appendString(b, c.ClientID)
	b = appendString(b, c.SessionID)
	b = binary.AppendVarint(b, c.Now)
	b = binary.AppendVarint(b, c.TTLMs)
	b = binary.AppendVarint(b, c.Headroom)
	b = appendBool(b, c.ProbeOK)
	return appendBool(b, c.Draining)
}

func (c Deregister) appendPayload(b []byte) []byte {
	b = appendString(b, c.ClientID)
	return appendString(b, c.SessionID)
}

func (c Claim) appendPayload(b []byte) []byte {
	b = appendKey(b, c.Key)
	b = appendString(b, c.ClientID)
	b = binary.AppendVarint(b, c.Now)
	return binary.AppendVarint(b, c.QuarantineMs)
}

func (c Release) appendPayload(b []byte) []byte {
	b = appendKey(b, c.Key)
	b = appendString(b, c.ClientID)
	return binary.AppendUvarint(b, c.Generation)
}

func (c GiveBack) appendPayload(b []byte) []byte {
	b = appendKey(b, c.Key)
	b = appendString(b, c.ClientID)
	b = appendString(b, c.SessionID)
	return binary.AppendUvarint(b, c.Generation)
}

func (c DrainWorker) appendPayload(b []byte) []byte {
	b = appendString(b, c.ClientID)
	b = binary.AppendVarint(b, c.Deadline)
	b = appendBool(b, c.Cordon)
	return binary.AppendVarint(b, c.Now)
}

func (c UndrainWorker) appendPayload(b []byte) []byte {
	return appendString(b, c.ClientID)
}

func (c DrainNode) appendPayload(b []byte) []byte {
	b = appendString(b, c.NodeID)
	b = binary.AppendVarint(b, c.Deadline)
	b = appendBool(b, c.Cordon)
	return binary.AppendVarint(b, c.Now)
}

func (c UndrainNode) appendPayload(b []byte) []byte {
	return appendString(b, c.NodeID)
}

func (c RenewLeases) appendPayload(b []byte) []byte {
	b = binary.AppendVarint(b, c.Now)
	b = binary.AppendVarint(b, c.TTLMs)
	return appendString(b, c.FormerLeader)
}

func (c GC) appendPayload(b []byte) []byte {
	b = binary.AppendVarint(b, c.Now)
	return binary.AppendVarint(b, c.WorkerRetentionMs)
}

// A batch holds each command as a length-prefixed (type byte, payload), so an
// ignorable command of an unknown type can be skipped without parsing it.
func (c Batch) appendPayload(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(c.Commands)))
	for _, sub := range c.Commands {
		b = appendSub(b, sub)
	}
	return b
}

func appendSub(b []byte, c Command) []byte {
	// Reserve one byte for the length; most sub-commands are short. Longer
	// ones shift the body once.
	at := len(b)
	b = append(b, 0)
	b = append(b, typeByte(c))
	b = c.appendPayload(b)
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	var lenBuf [binary.MaxVarintLen64]byte
	ln := binary.PutUvarint(lenBuf[:], uint64(n))
	b = append(b, lenBuf[:ln-1]...)
	copy(b[at+ln:], b[at+1:at+1+n])
	copy(b[at:], lenBuf[:ln])
	return b
}

func (o Opaque) appendPayload(b []byte) []byte { return append(b, o.Payload...) }

func typeByte(c Command) byte {
	t := byte(c.Type()) &^ IgnorableFlag
	switch c := c.(type) {
	case Opaque:
		if c.Ignorable {
			t |= IgnorableFlag
		}
	case Reseal:
		// A node of a version before it keeps the secret sealed as
		// before, which opens while the old token is still listed.
		t |= IgnorableFlag
	case RenewLeases:
		// A node of a version before it skips it and judges leases as it
		// did then, until the next heartbeats bring the leases together
		// again: a rolling upgrade's elections need no version gate.
		t |= IgnorableFlag
	}
	return t
}

// Encode returns the log entry bytes of cmd.
func Encode(cmd Command) []byte { return AppendCommand(make([]byte, 0, 64), cmd) }

// AppendCommand appends the encoding of cmd to b.
func AppendCommand(b []byte, cmd Command) []byte {
	v := FormatVersion
	if o, ok := cmd.(Opaque); ok && o.Version != 0 {
		v = o.Version // a foreign version stays foreign: its type may mean something else here
	}
	b = append(b, v, typeByte(cmd))
	return cmd.appendPayload(b)
}

// DecodeCommand parses a log entry. An unknown command type decodes as
// Opaque; an unknown format version decodes as Opaque when the ignorable bit
// is set and fails with ErrVersion otherwise.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) < 2 || b[0] == 0 { // version 0 was never written; Opaque uses it for "current"
		return nil, ErrMalformed
	}
	if b[0] != FormatVersion {
		if b[1]&IgnorableFlag != 0 {
			return Opaque{Version: b[0], Code: CommandType(b[1] &^ IgnorableFlag), Ignorable: true,
				Payload: append([]byte(nil), b[2:]...)}, nil
		}
		return nil, fmt.Errorf("%w: %d", ErrVersion, b[0])
	}
	return decodeBody(b[1], b[2:], false)
}

func decodeBody(t byte, payload []byte, inBatch bool) (Command, error) {
	d := decoder{b: payload}
	var c Command
	// A known type is applied whether or not its ignorable bit is set: the
	// bit only tells nodes that do not know the type what to do.
	switch CommandType(t &^ IgnorableFlag) {
	case TypeInit:
		c = Init{Secret: append([]byte(nil), d.bytes()...)}
	case TypeReseal:
		c = Reseal{Secret: append([]byte(nil), d.bytes()...)}
	case TypeRegister:
		c = d.register()
	case TypeRegisterRoutes:
		c = RegisterRoutes{Register: d.register(), Routes: d.routes()}
	case TypeHeartbeat:
		c = Heartbeat{
			ClientID: d.string(), SessionID: d.string(),
			Now: d.varint(), TTLMs: d.varint(), Headroom: d.varint(), ProbeOK: d.bool(),
			Draining: d.bool(),
		}
	case TypeDeregister:
		c = Deregister{ClientID: d.string(), SessionID: d.string()}
	case TypeClaim:
		c = d.claim()
	case TypeClaimRoute:
		c = ClaimRoute{Claim: d.claim(), Hostname: d.string(), TTLMs: d.varint()}
	case TypeRelease:
		c = Release{Key: d.key(), ClientID: d.string(), Generation: d.uvarint()}
	case TypeGiveBack:
		c = GiveBack{Key: d.key(), ClientID: d.string(), SessionID: d.string(), Generation: d.uvarint()}
	case TypeDrain:
		c = DrainWorker{ClientID: d.string(), Deadline: d.varint(), Cordon: d.bool(), Now: d.varint()}
	case TypeUndrain:
		c = UndrainWorker{ClientID: d.string()}
	case TypeDrainNode:
		c = DrainNode{NodeID: d.string(), Deadline: d.varint(), Cordon: d.bool(), Now: d.varint()}
	case TypeUndrainNode:
		c = UndrainNode{NodeID: d.string()}
	case TypeRenewLeases:
		c = RenewLeases{Now: d.varint(), TTLMs: d.varint(), FormerLeader: d.string()}
	case TypeGC:
		c = GC{Now: d.varint(), WorkerRetentionMs: d.varint()}
	case TypeBatch:
		if inBatch {
			return nil, ErrNestedBatch
		}
		n := d.count(2)
		cmds := make([]Command, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			sub := d.bytes()
			if len(sub) == 0 {
				d.fail()
				break
			}
			sc, err := decodeBody(sub[0], sub[1:], true)
			if err != nil {
				return nil, err
			}
			cmds = append(cmds, sc)
		}
		c = Batch{Commands: cmds}
	default:
		return Opaque{
			Code:      CommandType(t &^ IgnorableFlag),
			Ignorable: t&IgnorableFlag != 0,
			Payload:   append([]byte(nil), payload...),
		}, nil
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return c, nil
}

func (d *decoder) register() Register {
	return Register{
		ClientID: d.string(), SessionID: d.string(), NodeID: d.string(),
		AdvertiseURL: d.string(), Namespaces: d.strings(),
		Headroom: d.varint(), TTLMs: d.varint(), Now: d.varint(),
		LiveIDs: d.keys(), Draining: d.bool(),
	}
}

func (d *decoder) claim() Claim {
	return Claim{Key: d.key(), ClientID: d.string(), Now: d.varint(), QuarantineMs: d.varint()}
}
