package counter

import (
	"strings"
	"testing"
)

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
