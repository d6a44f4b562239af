package directory

import (
	"encoding/binary"
	"math"
)

// The wire primitives: unsigned varints for lengths, counts and indexes,
// zig-zag varints for times and other signed values, a byte for booleans,
// and length-prefixed bytes for strings. Deterministic by construction: each
// value has exactly one encoding.

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendKey(b []byte, k Key) []byte {
	b = appendString(b, k.Env)
	b = appendString(b, k.Namespace)
	return appendString(b, k.ID)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

func appendKeys(b []byte, ks []Key) []byte {
	b = binary.AppendUvarint(b, uint64(len(ks)))
	for _, k := range ks {
		b = appendKey(b, k)
	}
	return b
}

// decoder reads primitives from a byte slice. The first failure sticks in err
// and every later read returns a zero value, so callers check once at the end.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = ErrMalformed
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail() // one encoding per value: only 0 and 1
	return false
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }

func (d *decoder) key() Key {
	return Key{Env: d.string(), Namespace: d.string(), ID: d.string()}
}

// count reads a list length and rejects one that could not fit in the bytes
// left (each element takes at least min bytes), so a forged count cannot make
// us allocate gigabytes.
func (d *decoder) count(min int) int {
	n := d.uvarint()
	if n > math.MaxInt32 || n*uint64(min) > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *decoder) strings() []string {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.string()
	}
	return ss
}

func (d *decoder) keys() []Key {
	n := d.count(3)
	if n == 0 {
		return nil
	}
	ks := make([]Key, n)
	for i := range ks {
		ks[i] = d.key()
	}
	return ks
}

// done reports the sticky error, or ErrMalformed when bytes are left over:
// a payload has exactly one length, so trailing bytes mean a different format.
func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = ErrMalformed
	}
	return d.err
}

func appendRoutes(b []byte, rs []Route) []byte {
	b = binary.AppendUvarint(b, uint64(len(rs)))
	for _, r := range rs {
		b = appendString(b, r.Hostname)
		b = appendString(b, r.Namespace)
		b = appendString(b, r.Env)
		b = append(b, byte(r.Takeover))
		b = binary.AppendUvarint(b, r.Epoch)
		b = appendBool(b, r.Superseded)
	}
	return b
}

func (d *decoder) routes() []Route {
	n := d.count(6)
	if n == 0 {
		return nil
	}
	rs := make([]Route, n)
	for i := range rs {
		rs[i] = Route{Hostname: d.string(), Namespace: d.string(), Env: d.string(),
			Takeover: TakeoverPolicy(d.byte()), Epoch: d.uvarint(), Superseded: d.bool()}
		if rs[i].Takeover > TakeoverDeny {
			d.fail() // one encoding per value
		}
	}
	return rs
}
