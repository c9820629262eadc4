package counter

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// This file is the worker's side of a group's state string: its layout,
// which observe.lua reads and writes (its header says what each field
// means), decoded, counted into and encoded again in Go, byte for byte as
// the script would. The engine's
// fast path counts here and writes back with cas.lua, which stores the
// result only if the string is still the one that was read; Redis then
// spends a GET, a GETRANGE and a SET on a group instead of running the
// counting.

// The state string's layout, here only: decodeState and encode read and
// write it field by field, and the scripts get it from withLayout. The
// formats are those of the struct library observe.lua packs with ('<'
// little-endian, B a byte, iN and IN signed and unsigned integers of N
// bytes); TestStateLayoutSizes holds the sizes to them.
const (
	stateVersion = 3
	// pageSize is how many ids a dedup slot keeps inline, and a page about.
	pageSize = 128

	dedupLayout = "i8i1I2I4I4" // slot level next count inlinebytes
	// version dedup[cur] dedup[prev] tokens(4) nrings nstates npairs generation
	headerLayout = "<B" + dedupLayout + dedupLayout + "i8i8i8i8" + "I2I2I4" + "I4"
	ringLayout   = "i8i8i8I2" // tag until L npairs
	ruleLayout   = "i8i8i8i8" // tag until L U
	pairLayout   = "i8I4"     // bucket index, count

	headerSize = 83
	genOffset  = headerSize - 4 // the generation, new at every write (nextGen)
	ringSize   = 26
	ruleSize   = 32
	pairSize   = 12
)

// withLayout fills the state's layout into a script's placeholders.
func withLayout(script string) string {
	return strings.NewReplacer(
		"${VERSION}", strconv.Itoa(stateVersion),
		"${PAGE}", strconv.Itoa(pageSize),
		"${HEADER}", headerLayout,
		"${HEADER_SIZE}", strconv.Itoa(headerSize),
		"${RING}", ringLayout,
		"${RULE}", ruleLayout,
		"${PAIR}", pairLayout,
		// GETRANGE's range, from 0, both ends included.
		"${GEN_FIRST}", strconv.Itoa(genOffset),
		"${GEN_LAST}", strconv.Itoa(genOffset+3),
	).Replace(script)
}

type dedupSlot struct {
	slot   int64
	level  int8
	next   uint16
	count  uint32
	inline []byte
}

type ringState struct {
	tag, until, at int64 // at: L, the newest time seen
	pairs          []int64
	// While counting: the ring's period and bucket in ms, the event it
	// last counted, and whether it was counted into.
	period, bucket, seen int64
	touched              bool
}

type ruleState struct {
	tag, until, at, rearm int64
}

// groupState is a group's state string, decoded.
type groupState struct {
	cur, prev dedupSlot
	tokens    [4]int64
	rings     []ringState
	rules     []ruleState
	gen       uint32
}

// decodeState reads raw as observe.lua's load does at Redis time now; a
// missing or foreign string is an empty state, and so is one parseState
// cannot read.
func decodeState(raw []byte, now, slot int64) *groupState {
	g, err := parseState(raw, slot)
	if err != nil {
		return emptyState(slot)
	}
	return g
}

// emptyState is the state of a group with nothing stored.
func emptyState(slot int64) *groupState {
	return &groupState{cur: dedupSlot{slot: slot, level: -1}, prev: dedupSlot{slot: slot - 1, level: -1}}
}

// parseState reads a state string in dedup slot slot. A missing or foreign
// one (shorter than a header, or of another version) is an empty state, as
// observe.lua's load has it; one whose sections do not fit its length is an
// error.
func parseState(raw []byte, slot int64) (*groupState, error) {
	g := emptyState(slot)
	if len(raw) < headerSize || raw[0] != stateVersion {
		return g, nil
	}
	r := reader{b: raw, p: 1}
	cur := dedupSlot{slot: r.i64(), level: int8(r.u8()), next: r.u16(), count: r.u32()}
	cb := int(r.u32())
	prev := dedupSlot{slot: r.i64(), level: int8(r.u8()), next: r.u16(), count: r.u32()}
	pb := int(r.u32())
	for i := range g.tokens {
		g.tokens[i] = r.i64()
	}
	nr, ns, np := int(r.u16()), int(r.u16()), int(r.u32())
	g.gen = r.u32()
	// The counts are held to the length before anything is made of them:
	// no string, whatever wrote it, costs more memory than its own size.
	if need, left := nr*ringSize+ns*ruleSize+np*pairSize+cb+pb, len(raw)-headerSize; need > left {
		return nil, fmt.Errorf("state of %d bytes: its header counts %d bytes past the end", len(raw), need-left)
	}
	g.rings = make([]ringState, nr)
	for i := range g.rings {
		g.rings[i] = ringState{tag: r.i64(), until: r.i64(), at: r.i64()}
		g.rings[i].pairs = make([]int64, 0, 2*int(r.u16()))
	}
	g.rules = make([]ruleState, ns)
	for i := range g.rules {
		g.rules[i] = ruleState{tag: r.i64(), until: r.i64(), at: r.i64(), rearm: r.i64()}
	}
	total := 0
	for i := range g.rings {
		n := cap(g.rings[i].pairs) / 2
		for range n {
			g.rings[i].pairs = append(g.rings[i].pairs, r.i64(), int64(r.u32()))
		}
		total += n
	}
	if total != np {
		return nil, fmt.Errorf("state's rings hold %d pairs, its header %d", total, np)
	}
	cur.inline = r.bytes(cb)
	prev.inline = r.bytes(pb)
	if r.err {
		return nil, fmt.Errorf("state of %d bytes ends inside a section", len(raw))
	}
	// The previous slot is the stored current one a slot on, or the stored
	// previous one when no id came since: encode writes an empty current
	// slot as slot 0.
	switch cur.slot {
	case slot:
		g.cur = cur
	case slot - 1:
		g.prev = cur
	}
	if cur.slot != slot-1 && prev.slot == slot-1 {
		g.prev = prev
	}
	return g, nil
}

// paged reports whether slot d keeps its ids in pages.
func (d *dedupSlot) paged() bool { return d.count > 0 && d.level >= 0 }

// page is the page of a paged slot that holds key k: linear hashing on the
// key's first 4 bytes, as observe.lua's page.
func (d *dedupSlot) page(k []byte) int {
	sel := int64(binary.LittleEndian.Uint32(k))
	n := int64(1) << d.level
	i := sel % n
	if i < int64(d.next) {
		i = sel % (2 * n)
	}
	return int(i)
}

// pageKey is the key of page n of a slot, under the group's base.
func pageKey(base string, slot int64, n int) string {
	return base + ":d:" + strconv.FormatInt(slot, 10) + ":" + strconv.Itoa(n)
}

// pagesToRead lists the pages a batch's new ids need read: where each id
// would be in the current and previous slots, and the pages of the current
// slot that adding them all splits (the splits need their content).
func (g *groupState) pagesToRead(base string, ids []byte) []string {
	seen := make(map[string]bool)
	var keys []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, d := range [...]*dedupSlot{&g.cur, &g.prev} {
		if !d.paged() {
			continue
		}
		for i := 0; i+8 <= len(ids); i += 8 {
			add(pageKey(base, d.slot, d.page(ids[i:i+8])))
		}
	}
	if d := g.cur; d.paged() {
		count := int64(d.count) + int64(len(ids)/8)
		level, next := d.level, int64(d.next)
		for count > pageSize*((int64(1)<<level)+next) {
			add(pageKey(base, d.slot, int(next)))
			if next++; next == int64(1)<<level {
				level, next = level+1, 0
			}
		}
	}
	return keys
}

// holds reports whether the current or previous slot holds key, inline or
// in the pages read (by key; a page not read holds nothing).
func (g *groupState) holds(base string, key []byte, pages map[string][]byte) bool {
	for _, d := range [...]*dedupSlot{&g.cur, &g.prev} {
		if d.count == 0 {
			continue
		}
		ids := d.inline
		if d.level >= 0 {
			ids = pages[pageKey(base, d.slot, d.page(key))]
		}
		for i := 0; i+8 <= len(ids); i += 8 {
			if bytes.Equal(ids[i:i+8], key) {
				return true
			}
		}
	}
	return false
}

// remember adds new ids to the current slot as observe.lua's remember does,
// pages and splits included, working on the pages read. It returns what to
// write: pages to set whole, and bytes to append to the others.
func (g *groupState) remember(base string, ids []byte, pages map[string][]byte) (set, add map[string][]byte) {
	d := &g.cur
	set, add = make(map[string][]byte), make(map[string][]byte)
	if d.level < 0 {
		d.inline = append(d.inline, ids...)
	} else {
		for i := 0; i+8 <= len(ids); i += 8 {
			k := pageKey(base, d.slot, d.page(ids[i:i+8]))
			add[k] = append(add[k], ids[i:i+8]...)
		}
	}
	d.count += uint32(len(ids) / 8)
	if d.level < 0 && d.count > pageSize {
		set[pageKey(base, d.slot, 0)] = d.inline
		d.inline, d.level, d.next = nil, 0, 0
	}
	for d.level >= 0 && int64(d.count) > pageSize*((int64(1)<<d.level)+int64(d.next)) {
		n := int64(1) << d.level
		from, to := pageKey(base, d.slot, int(d.next)), pageKey(base, d.slot, int(int64(d.next)+n))
		src, whole := set[from]
		if !whole {
			src = append(append([]byte(nil), pages[from]...), add[from]...)
		}
		var keep, move []byte
		for i := 0; i+8 <= len(src); i += 8 {
			if int64(binary.LittleEndian.Uint32(src[i:]))%(2*n) == int64(d.next) {
				keep = append(keep, src[i:i+8]...)
			} else {
				move = append(move, src[i:i+8]...)
			}
		}
		set[from], set[to] = keep, move
		delete(add, from)
		if d.next++; int64(d.next) == n {
			d.level, d.next = d.level+1, 0
		}
	}
	return set, add
}

func (g *groupState) replayed(token int64) bool {
	for _, t := range g.tokens {
		if t == token {
			return true
		}
	}
	return false
}

// ring is the group's ring of window w, as observe.lua's ring: one past its
// until starts empty.
func (g *groupState) ring(tag, period, bucket, now int64) *ringState {
	for i := range g.rings {
		r := &g.rings[i]
		if r.tag != tag {
			continue
		}
		if !r.touched {
			r.touched, r.period, r.bucket = true, period, bucket
			if r.until <= now {
				r.at, r.pairs = 0, r.pairs[:0]
			}
		}
		return r
	}
	g.rings = append(g.rings, ringState{tag: tag, period: period, bucket: bucket, touched: true})
	return &g.rings[len(g.rings)-1]
}

// add counts an event at te, as observe.lua's add.
func (r *ringState) add(te int64) {
	r.at = max(r.at, te)
	lo := floorDiv(r.at-r.period, r.bucket)
	drop := 0
	for drop < len(r.pairs) && r.pairs[drop] < lo {
		drop += 2
	}
	r.pairs = r.pairs[drop:]
	i := floorDiv(te, r.bucket)
	if i < lo {
		return
	}
	k := len(r.pairs) - 2
	for k >= 0 && r.pairs[k] > i {
		k -= 2
	}
	if k >= 0 && r.pairs[k] == i {
		r.pairs[k+1]++
		return
	}
	r.pairs = append(r.pairs, 0, 0)
	copy(r.pairs[k+4:], r.pairs[k+2:])
	r.pairs[k+2], r.pairs[k+3] = i, 1
}

func (r *ringState) sum() int64 {
	var n int64
	for k := 1; k < len(r.pairs); k += 2 {
		n += r.pairs[k]
	}
	return n
}

// rule is the index of a rule's state, as observe.lua's state: one past
// its until starts at zero, and a new one is kept only once it counts.
func (g *groupState) rule(tag, now int64) *ruleState {
	for i := range g.rules {
		s := &g.rules[i]
		if s.tag == tag {
			if s.until <= now {
				*s = ruleState{tag: tag}
			}
			return s
		}
	}
	g.rules = append(g.rules, ruleState{tag: tag})
	return &g.rules[len(g.rules)-1]
}

// encode writes the state as observe.lua's save does, leaving out what is
// past its until, and returns it with its expiry (Redis ms).
func (g *groupState) encode(now, slot, dedupTTL int64) ([]byte, int64) {
	idsUntil := (slot + 2) * dedupTTL
	var expiry int64
	empty := dedupSlot{level: -1}
	cur, prev := g.cur, g.prev
	if cur.count > 0 {
		expiry = idsUntil
	} else {
		cur = empty
	}
	if prev.count > 0 && prev.slot == slot-1 {
		expiry = max(expiry, idsUntil-dedupTTL)
	} else {
		prev = empty
	}
	var rings []*ringState
	npairs := 0
	for i := range g.rings {
		if r := &g.rings[i]; r.until > now {
			rings = append(rings, r)
			npairs += len(r.pairs) / 2
			expiry = max(expiry, r.until)
		}
	}
	var live []*ruleState
	for i := range g.rules {
		if s := &g.rules[i]; s.until > now {
			live = append(live, s)
			expiry = max(expiry, s.until)
		}
	}
	if expiry <= now {
		expiry = now + 1000
	}
	w := make([]byte, 0, headerSize+ringSize*len(rings)+ruleSize*len(live)+pairSize*npairs+len(cur.inline)+len(prev.inline))
	le := binary.LittleEndian
	w = append(w, stateVersion)
	for _, d := range [...]*dedupSlot{&cur, &prev} {
		w = le.AppendUint64(w, uint64(d.slot))
		w = append(w, byte(d.level))
		w = le.AppendUint16(w, d.next)
		w = le.AppendUint32(w, d.count)
		w = le.AppendUint32(w, uint32(len(d.inline)))
	}
	for _, t := range g.tokens {
		w = le.AppendUint64(w, uint64(t))
	}
	w = le.AppendUint16(w, uint16(len(rings)))
	w = le.AppendUint16(w, uint16(len(live)))
	w = le.AppendUint32(w, uint32(npairs))
	w = le.AppendUint32(w, nextGen(g.gen, g.tokens[0]))
	for _, r := range rings {
		w = le.AppendUint64(w, uint64(r.tag))
		w = le.AppendUint64(w, uint64(r.until))
		w = le.AppendUint64(w, uint64(r.at))
		w = le.AppendUint16(w, uint16(len(r.pairs)/2))
	}
	for _, s := range live {
		w = le.AppendUint64(w, uint64(s.tag))
		w = le.AppendUint64(w, uint64(s.until))
		w = le.AppendUint64(w, uint64(s.at))
		w = le.AppendUint64(w, uint64(s.rearm))
	}
	for _, r := range rings {
		for k := 0; k < len(r.pairs); k += 2 {
			w = le.AppendUint64(w, uint64(r.pairs[k]))
			w = le.AppendUint32(w, uint32(r.pairs[k+1]))
		}
	}
	w = append(w, cur.inline...)
	w = append(w, prev.inline...)
	return w, expiry
}

// writeRecord adds a firing to an event's record as observe.lua writes it
// for replays: "id,L,U,window,nw,count...", firings joined by commas.
func writeRecord(b *strings.Builder, id, at, rearm int64, window int, counts []int64) {
	if b.Len() > 0 {
		b.WriteByte(',')
	}
	fmt.Fprintf(b, "%d,%d,%d,%d,%d", id, at, rearm, window, len(counts))
	for _, c := range counts {
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(c, 10))
	}
}

// reader reads little-endian values; past the end it sets err.
type reader struct {
	b   []byte
	p   int
	err bool
}

// take returns the next n bytes, or nil past the end.
func (r *reader) take(n int) []byte {
	if r.err || n < 0 || n > len(r.b)-r.p {
		r.err = true
		return nil
	}
	r.p += n
	return r.b[r.p-n : r.p]
}

// fixed takes the n bytes of a number, zeros past the end.
func (r *reader) fixed(n int) []byte {
	if b := r.take(n); b != nil {
		return b
	}
	return make([]byte, n)
}

func (r *reader) u8() uint8   { return r.fixed(1)[0] }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.fixed(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.fixed(4)) }
func (r *reader) i64() int64  { return int64(binary.LittleEndian.Uint64(r.fixed(8))) }

func (r *reader) bytes(n int) []byte {
	b := r.take(n)
	return append([]byte(nil), b...)
}

// nextGen is the generation a write stores: the last one plus one plus the
// writing batch's token (its newest), as observe.lua computes it. A count
// alone would let two histories of a group that parted in a failover (one
// on the old master, one on the new) reach the same generation, and a
// compare-and-set against a state read from one node pass on the other,
// writing over counts acknowledged there; tokens are random per batch.
func nextGen(gen uint32, token int64) uint32 {
	return gen + 1 + uint32(uint64(token))
}
