package statestore

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Limits, the same for every implementation so that a host behaves alike on every store. They
// are generous for the intended use (JSON state, client commands) and small enough that one
// Commit stays one reasonable transaction.
const (
	// MaxKeyLen bounds an instance namespace or id, in bytes.
	MaxKeyLen = 512
	// MaxTrayNameLen bounds a tray NS or ID, in bytes.
	MaxTrayNameLen = 128
	// MaxFieldNameLen bounds a field name, in bytes.
	MaxFieldNameLen = 128
	// MaxValueLen bounds a field value or an item payload, in bytes.
	MaxValueLen = 1 << 20
	// MaxCommitBytes bounds the sum of values and payloads in one Commit.
	MaxCommitBytes = 16 << 20
	// MaxMutations bounds the mutations in one Commit.
	MaxMutations = 1024
	// MaxCommitItems bounds the payloads appended by one Commit.
	MaxCommitItems = 4096
	// MaxListLimit bounds the limit of ListMarked.
	MaxListLimit = 10000
	// MaxGeneration is the largest generation accepted: Postgres stores it as a signed bigint,
	// and a Raft index will not get there.
	MaxGeneration = math.MaxInt64
)

// ValidateName checks one name: non-empty, at most max bytes, valid UTF-8 and free of NUL
// bytes. NUL is refused because Postgres text cannot hold it and because the embedded store
// uses it as the separator of its order-preserving keys.
func ValidateName(what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	case len(s) > max:
		return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrInvalid, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	}
	return nil
}

// ValidateInstance checks an instance key.
func ValidateInstance(inst InstanceKey) error {
	if err := ValidateName("namespace", inst.Namespace, MaxKeyLen); err != nil {
		return err
	}
	return ValidateName("instance id", inst.ID, MaxKeyLen)
}

// ValidateFence checks the arguments of Fence and Load.
func ValidateFence(inst InstanceKey, gen uint64) error {
	if err := ValidateInstance(inst); err != nil {
		return err
	}
	if gen == 0 || gen > MaxGeneration {
		return fmt.Errorf("%w: generation %d outside 1..%d", ErrInvalid, gen, uint64(MaxGeneration))
	}
	return nil
}

// ValidateTray checks a tray key.
func ValidateTray(k TrayKey) error {
	if err := ValidateName("tray namespace", k.NS, MaxTrayNameLen); err != nil {
		return err
	}
	return ValidateName("tray id", k.ID, MaxTrayNameLen)
}

// ValidateListLimit checks the limit of ListMarked.
func ValidateListLimit(limit int) error {
	if limit < 1 || limit > MaxListLimit {
		return fmt.Errorf("%w: limit %d outside 1..%d", ErrInvalid, limit, MaxListLimit)
	}
	return nil
}

// ValidateAfter checks the cursor of ListMarked: the zero key, or a valid key. A key with a
// namespace and no id is allowed too: since "" sorts first, it lists that namespace from its
// first id.
func ValidateAfter(after InstanceKey) error {
	if after.Namespace == "" && after.ID == "" {
		return nil
	}
	if err := ValidateName("namespace", after.Namespace, MaxKeyLen); err != nil {
		return err
	}
	if after.ID == "" {
		return nil
	}
	return ValidateName("instance id", after.ID, MaxKeyLen)
}

// ValidateCommit checks every argument of Commit before anything is written, so an invalid
// mutation anywhere in muts changes nothing. It returns the number of payloads appended.
func ValidateCommit(inst InstanceKey, gen uint64, muts []Mutation) (appended int, err error) {
	if err := ValidateFence(inst, gen); err != nil {
		return 0, err
	}
	if len(muts) > MaxMutations {
		return 0, fmt.Errorf("%w: %d mutations, limit %d", ErrInvalid, len(muts), MaxMutations)
	}
	total := 0
	for i, m := range muts {
		if m == nil {
			return 0, fmt.Errorf("%w: mutation %d is nil", ErrInvalid, i)
		}
		if err := ValidateTray(m.tray()); err != nil {
			return 0, fmt.Errorf("mutation %d: %w", i, err)
		}
		switch m := m.(type) {
		case SetField:
			if err := ValidateName("field name", m.Name, MaxFieldNameLen); err != nil {
				return 0, fmt.Errorf("mutation %d: %w", i, err)
			}
			if len(m.Value) > MaxValueLen {
				return 0, fmt.Errorf("%w: mutation %d: field %q value is %d bytes, limit %d",
					ErrInvalid, i, m.Name, len(m.Value), MaxValueLen)
			}
			total += len(m.Value)
		case AppendItems:
			for j, p := range m.Payloads {
				if len(p) > MaxValueLen {
					return 0, fmt.Errorf("%w: mutation %d: payload %d is %d bytes, limit %d",
						ErrInvalid, i, j, len(p), MaxValueLen)
				}
				total += len(p)
			}
			appended += len(m.Payloads)
		case MarkApplied:
			if m.UpTo < 0 {
				return 0, fmt.Errorf("%w: mutation %d: negative UpTo %d", ErrInvalid, i, m.UpTo)
			}
		case RemoveItems:
			if m.UpTo < 0 {
				return 0, fmt.Errorf("%w: mutation %d: negative UpTo %d", ErrInvalid, i, m.UpTo)
			}
		case DeleteTray:
		default:
			// Unreachable while Mutation is sealed; kept so a new type cannot slip through.
			return 0, fmt.Errorf("%w: mutation %d has unknown type %T", ErrInvalid, i, m)
		}
	}
	if total > MaxCommitBytes {
		return 0, fmt.Errorf("%w: commit carries %d bytes, limit %d", ErrInvalid, total, MaxCommitBytes)
	}
	if appended > MaxCommitItems {
		return 0, fmt.Errorf("%w: commit appends %d items, limit %d", ErrInvalid, appended, MaxCommitItems)
	}
	return appended, nil
}

// ValidateCollect checks the arguments of CollectFences: below within 0..MaxGeneration (0
// collects nothing), every live placement a valid instance with a valid generation.
func ValidateCollect(below uint64, live []Live) error {
	if below > MaxGeneration {
		return fmt.Errorf("%w: below %d over %d", ErrInvalid, below, uint64(MaxGeneration))
	}
	for _, l := range live {
		if err := ValidateFence(l.Inst, l.Generation); err != nil {
			return fmt.Errorf("live placement: %w", err)
		}
	}
	return nil
}
