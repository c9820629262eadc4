package counter

import (
	"strconv"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// stateTag numbers a rule's state in a group by the rule's id and version,
// so that an edit that changes what the state means starts it afresh. The
// tags are 46 bits, which Lua's numbers and its '%.14g' formatting keep
// exactly.
func stateTag(r *rules.Rule) int64 { return tag46("state", r.ID, r.Version) }

// idTag numbers a rule by its id alone, for the firings told in replies.
func idTag(r *rules.Rule) int64 { return tag46("rule", r.ID) }

// ringTag numbers the ring of buckets that counts a rule's events over one
// period: every rule with the same title filter counts the same events, so
// rules of one filter and period share a ring.
func ringTag(r *rules.Rule, period time.Duration) int64 {
	var ms [20]byte
	h := fnvPart(fnvPart(fnvOffset, "ring"), r.FilterKey())
	return int64(fnvPart(h, strconv.AppendInt(ms[:0], period.Milliseconds(), 10)) >> 18)
}

// tag46 is the 64-bit FNV-1a hash of parts, each followed by a zero byte,
// cut to 46 bits. It is hashed here rather than with hash/fnv, whose
// Write takes a []byte: tags are worked out for every rule of every batch,
// and this allocates nothing.
func tag46(parts ...string) int64 {
	h := uint64(fnvOffset)
	for _, p := range parts {
		h = fnvPart(h, p)
	}
	return int64(h >> 18)
}

// The 64-bit FNV-1a parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvAdd adds p to FNV-1a hash h.
func fnvAdd[T ~string | ~[]byte](h uint64, p T) uint64 {
	for i := 0; i < len(p); i++ {
		h = (h ^ uint64(p[i])) * fnvPrime
	}
	return h
}

// fnvPart adds part and the zero byte after it to FNV-1a hash h.
func fnvPart[T ~string | ~[]byte](h uint64, part T) uint64 {
	return fnvAdd(h, part) * fnvPrime // h ^ 0 is h
}
