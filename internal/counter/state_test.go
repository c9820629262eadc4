package counter

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// The state codec without Redis: what encode writes, decode reads back as
// it was, and no string of bytes, whatever wrote it, makes decode panic.

const (
	testTTL  = 600_000           // ms, the default dedupTTL
	testNow  = 1_700_000_000_000 // ms
	testSlot = testNow / testTTL
)

// The Go constants of the layout are the sizes of the formats the scripts
// are given, and the scripts are given every one of them.
func TestStateLayoutSizes(t *testing.T) {
	for _, c := range []struct {
		name   string
		layout string
		size   int
	}{
		{"header", headerLayout, headerSize},
		{"ring", ringLayout, ringSize},
		{"rule", ruleLayout, ruleSize},
		{"pair", pairLayout, pairSize},
	} {
		if got := structSize(t, c.layout); got != c.size {
			t.Errorf("%s: format %q packs %d bytes, the constant says %d", c.name, c.layout, got, c.size)
		}
	}
	if got := structSize(t, headerLayout[:strings.LastIndex(headerLayout, "I4")]); got != genOffset {
		t.Errorf("the generation starts at byte %d of the header, genOffset says %d", got, genOffset)
	}
	g := &groupState{cur: dedupSlot{slot: testSlot, level: -1, count: 1, inline: []byte("8 bytes!")}}
	g.rings = []ringState{{tag: 1, until: testNow + 1, at: testNow, pairs: []int64{testNow / 1000, 1}}}
	g.rules = []ruleState{{tag: 2, until: testNow + 1, at: testNow}}
	raw, _ := g.encode(testNow, testSlot, testTTL)
	if want := headerSize + ringSize + ruleSize + pairSize + 8; len(raw) != want {
		t.Errorf("a state of one ring, rule, pair and id is %d bytes, want %d", len(raw), want)
	}
	for name, src := range map[string]string{"observe.lua": observeLua, "cas.lua": casLua} {
		if s := withLayout(src); strings.Contains(s, "${") {
			i := strings.Index(s, "${")
			t.Errorf("%s keeps a placeholder: %q", name, s[i:min(i+20, len(s))])
		}
	}
}

// structSize is how many bytes the struct library packs a format into: '<'
// none, B one, iN and IN N.
func structSize(t *testing.T, format string) int {
	t.Helper()
	n := 0
	for i := 0; i < len(format); i++ {
		switch c := format[i]; {
		case c == '<':
		case c == 'B':
			n++
		case (c == 'i' || c == 'I') && i+1 < len(format) && strings.IndexByte("1248", format[i+1]) >= 0:
			n += int(format[i+1] - '0')
			i++
		default:
			t.Fatalf("format %q: %q at %d is not a field this test knows", format, c, i)
		}
	}
	return n
}

type stateCase struct {
	name string
	// in is encoded in slot testSlot at testNow, and read back in slot
	// readSlot as want, with its expiry.
	in       *groupState
	readSlot int64
	want     *groupState
	expiry   int64
}

func stateCases() []stateCase {
	ids := []byte("id-one..id-two..")
	rings := []ringState{
		{tag: 11, until: testNow + 61_000, at: testNow - 5, pairs: []int64{testNow/1000 - 3, 2, testNow/1000 - 1, 7}},
		{tag: 12, until: testNow + 3_601_000, at: testNow, pairs: []int64{testNow / 60_000, 40}},
	}
	rules := []ruleState{
		{tag: 21, until: testNow + 3_601_000, at: testNow, rearm: testNow + 600_000},
		{tag: 22, until: testNow + 86_401_000, at: testNow - 5},
	}
	full := &groupState{
		cur:    dedupSlot{slot: testSlot, level: -1, count: 2, inline: ids},
		prev:   dedupSlot{slot: testSlot - 1, level: 1, next: 1, count: 300},
		tokens: [4]int64{5, 4, 3, 2},
		rings:  rings,
		rules:  rules,
		gen:    7,
	}
	fullBack := *full
	fullBack.gen = nextGen(7, 5)

	expired := &groupState{
		cur:    dedupSlot{slot: testSlot, level: -1},
		prev:   dedupSlot{slot: testSlot - 1, level: -1},
		tokens: [4]int64{9},
		rings:  append([]ringState{{tag: 10, until: testNow, at: testNow - 61_000, pairs: []int64{1, 1}}}, rings...),
		rules:  append([]ruleState{{tag: 20, until: testNow - 1, at: testNow - 1}}, rules...),
	}
	expiredBack := &groupState{
		cur:    dedupSlot{slot: testSlot, level: -1},
		prev:   dedupSlot{slot: testSlot - 1, level: -1},
		tokens: [4]int64{9},
		rings:  rings,
		rules:  rules,
		gen:    nextGen(0, 9),
	}

	nextSlot := &groupState{
		cur:    dedupSlot{slot: testSlot + 1, level: -1},
		prev:   dedupSlot{slot: testSlot, level: -1, count: 2, inline: ids},
		tokens: full.tokens,
		rings:  rings,
		rules:  rules,
		gen:    nextGen(7, 5),
	}
	return []stateCase{
		{"every section", full, testSlot, &fullBack, testNow + 86_401_000},
		{"sections past their until are left out", expired, testSlot, expiredBack, testNow + 86_401_000},
		{"a slot on, the current ids are the previous ones", full, testSlot + 1, nextSlot, testNow + 86_401_000},
		{"nothing but ids", &groupState{
			cur:  dedupSlot{slot: testSlot, level: -1, count: 2, inline: ids},
			prev: dedupSlot{slot: testSlot - 1, level: -1},
		}, testSlot, &groupState{
			cur:   dedupSlot{slot: testSlot, level: -1, count: 2, inline: ids},
			prev:  dedupSlot{slot: testSlot - 1, level: -1},
			rings: []ringState{},
			rules: []ruleState{},
			gen:   1,
		}, (testSlot + 2) * testTTL},
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, c := range stateCases() {
		t.Run(c.name, func(t *testing.T) {
			raw, expiry := c.in.encode(testNow, testSlot, testTTL)
			if expiry != c.expiry {
				t.Errorf("expiry %d, want %d", expiry, c.expiry)
			}
			got, err := parseState(raw, c.readSlot)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("read back\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
	if got, err := parseState(nil, testSlot); err != nil || !reflect.DeepEqual(got, emptyState(testSlot)) {
		t.Errorf("no state reads as %+v, %v; want an empty one", got, err)
	}
}

// A state cut short (a foreign writer, a bug) is an error to parseState,
// however much of it is left, and an empty state to decodeState; one too
// short for a header, or of another version, is foreign: empty.
func TestStateCutShort(t *testing.T) {
	raw, _ := stateCases()[0].in.encode(testNow, testSlot, testTTL)
	for n := range len(raw) {
		g, err := parseState(raw[:n], testSlot)
		if n < headerSize {
			if err != nil || !reflect.DeepEqual(g, emptyState(testSlot)) {
				t.Errorf("%d bytes: %+v, %v; want an empty state", n, g, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%d bytes of %d read without an error", n, len(raw))
		}
		if g := decodeState(raw[:n], testNow, testSlot); !reflect.DeepEqual(g, emptyState(testSlot)) {
			t.Errorf("%d bytes of %d decode as %+v, want an empty state", n, len(raw), g)
		}
	}
	other := bytes.Clone(raw)
	other[0] = stateVersion + 1
	if g, err := parseState(other, testSlot); err != nil || !reflect.DeepEqual(g, emptyState(testSlot)) {
		t.Errorf("another version: %+v, %v; want an empty state", g, err)
	}
}

// FuzzState feeds the decoder arbitrary bytes: it must not panic, and a
// state it reads, once encoded, reads back as itself (its generation on by
// one write). testdata/fuzz/FuzzState holds states observe.lua and the
// worker wrote to Redis, with the time they were read at.
//
//	go test -fuzz=FuzzState -fuzztime=30s ./internal/counter
func FuzzState(f *testing.F) {
	for _, c := range stateCases() {
		raw, _ := c.in.encode(testNow, testSlot, testTTL)
		f.Add(raw, int64(testNow))
	}
	f.Fuzz(func(t *testing.T, raw []byte, now int64) {
		// A time of this century: dedup slots well past 1, where an empty
		// current slot (written as slot 0) could be read as the previous one.
		now = 1<<40 + now&(1<<40-1)
		slot := now / testTTL
		decodeState(raw, now, slot)
		g, err := parseState(raw, slot)
		if err != nil {
			return
		}
		once, expiry := g.encode(now, slot, testTTL)
		back, err := parseState(once, slot)
		if err != nil {
			t.Fatalf("what encode wrote does not read: %v", err)
		}
		if want := nextGen(g.gen, g.tokens[0]); back.gen != want {
			t.Errorf("generation %d after a write of %d, want %d", back.gen, g.gen, want)
		}
		twice, expiry2 := back.encode(now, slot, testTTL)
		if expiry2 != expiry {
			t.Errorf("expiry %d, then %d", expiry, expiry2)
		}
		copy(twice[genOffset:genOffset+4], once[genOffset:genOffset+4])
		if !bytes.Equal(once, twice) {
			t.Errorf("encoded again, the state changed:\n%x\n%x", once, twice)
		}
	})
}
