package rules

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// pieces make words and titles: overlapping runs, prefixes of one another,
// multi-byte UTF-8, upper case, and characters whose lower case has another
// length (İ → i̇, K (Kelvin) → k), where cutting a title and lower-casing it
// must happen in Rule.Matches' order.
var pieces = []string{"a", "a", "b", "ab", "aa", "ba", "A", "B", "é", "É", "ß", "ẞ", "İ", "i", "\u212a", "k", "日本", "本", " ", "x"}

func randomText(rnd *rand.Rand, maxPieces int) string {
	var b strings.Builder
	for range rnd.IntN(maxPieces + 1) {
		b.WriteString(pieces[rnd.IntN(len(pieces))])
	}
	return b.String()
}

func randomWords(rnd *rand.Rand) []string {
	words := make([]string, rnd.IntN(4))
	for i := range words {
		words[i] = randomText(rnd, 4)
	}
	return words
}

// TestMatcherDecidesAsMatches holds the automaton to Rule.Matches, the
// readable specification, on random rules and titles: a rule the two
// disagree on would notify for an event its author excluded, or miss one.
func TestMatcherDecidesAsMatches(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 1))
	for round := range 400 {
		var rs []*Rule
		for i := range 1 + rnd.IntN(8) {
			spec := Spec{ID: fmt.Sprint("r", i), IsEnabled: true, WhatToReceive: SeenMore, Threshold: 1, ThresholdPeriod: 1000,
				Including: randomWords(rnd), Excluding: randomWords(rnd), Channels: hook()}
			if rnd.IntN(3) == 0 {
				spec.WhatToReceive = OnlyNew
			}
			// Mostly one title length per matcher, as one load compiles;
			// sometimes short ones, so titles are cut, and mixed ones.
			limits := Limits{}
			switch round % 4 {
			case 1:
				limits.MatchedTitleBytes = 7
			case 2:
				limits.MatchedTitleBytes = 3 + rnd.IntN(10)
			}
			r, _, err := limits.Compile("p", spec)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		m := NewMatcher(rs)
		for range 50 {
			title, isNew := randomText(rnd, 12), rnd.IntN(2) == 0
			if rnd.IntN(4) == 0 {
				// An event's title as the evaluator may see it, or a
				// word itself: either way a hit.
				title = strings.Join(rs[rnd.IntN(len(rs))].including, "")
			}
			var want []*Rule
			for _, r := range rs {
				if r.Matches(title, isNew) {
					want = append(want, r)
				}
			}
			if got := m.Match(title, isNew, nil); !slices.Equal(got, want) {
				t.Fatalf("title %q new %t: Match gives %s, Matches %s", title, isNew, ids(got), ids(want))
			}
		}
	}
}

func ids(rs []*Rule) string {
	var s []string
	for _, r := range rs {
		s = append(s, fmt.Sprintf("%s%q-%q", r.ID, r.including, r.excluding))
	}
	return strings.Join(s, " ")
}

func TestMatcherExamples(t *testing.T) {
	only := func(inc, exc []string) *Rule {
		r, _, err := Compile("p", Spec{ID: fmt.Sprint(inc, exc), IsEnabled: true, WhatToReceive: OnlyNew,
			Including: inc, Excluding: exc, Channels: hook()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	all := only(nil, nil)
	db := only([]string{"Database"}, []string{"staging"})
	nested := only([]string{"bc"}, nil) // inside another rule's word
	abcd := only([]string{"abcd"}, nil)
	m := NewMatcher([]*Rule{all, db, nested, abcd})
	for _, tc := range []struct {
		title string
		isNew bool
		want  []*Rule
	}{
		{"DATABASE down", true, []*Rule{all, db}},
		{"database down on Staging", true, []*Rule{all}},
		{"database down", false, nil},
		{"xabcdx", true, []*Rule{all, nested, abcd}},
		{"abc", true, []*Rule{all, nested}},
	} {
		if got := m.Match(tc.title, tc.isNew, nil); !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %s, want %s", tc.title, ids(got), ids(tc.want))
		}
	}
	var none *Matcher
	if none.Match("x", true, nil) != nil || none.Len() != 0 {
		t.Error("a nil Matcher matches")
	}
}

// attack is a pathological project within the default limits: 100 rules
// of 50 excluding words, each a run of one letter ending in another, as long as
// FilterBytes allows, against a title that is a run of the same letter:
// substring search finds none of them and compares nearly the whole word
// at every offset. The last word is in the title, so no rule matches: the
// events cost their project matching only.
func attack(tb testing.TB) ([]*Rule, string) {
	var rs []*Rule
	for i := range DefaultRulesPerProject {
		words := make([]string, DefaultFilterWords)
		for k := range words {
			// Distinct lengths within a rule, 60 to 80 bytes.
			words[k] = strings.Repeat("a", 59+(i+k)%21) + "b"
		}
		words[len(words)-1] = "aaaa"
		r, _, err := Compile("p", Spec{ID: fmt.Sprint("r", i), IsEnabled: true, WhatToReceive: OnlyNew,
			Excluding: words, Channels: hook()})
		if err != nil {
			tb.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs, strings.Repeat("A", DefaultMatchedTitleBytes)
}

// normal is a usual project: 5 rules of 2 words, and a 100-byte title.
func normal(tb testing.TB) ([]*Rule, string) {
	var rs []*Rule
	for i := range 5 {
		r, _, err := Compile("p", Spec{ID: fmt.Sprint("r", i), IsEnabled: true, WhatToReceive: SeenMore, Threshold: 10, ThresholdPeriod: 60_000,
			Including: []string{fmt.Sprint("error", i)}, Excluding: []string{fmt.Sprint("staging", i)}, Channels: hook()})
		if err != nil {
			tb.Fatal(err)
		}
		rs = append(rs, r)
	}
	title := "TypeError: Cannot read properties of undefined (reading 'id') at handler error3 in /srv/app/api.js:42"
	return rs, title[:100]
}

// The evaluator's path before the Matcher: the title lower-cased once, then
// every rule's Matches.
func benchmarkMatches(b *testing.B, rs []*Rule, title string) {
	b.ReportAllocs()
	var dst []*Rule
	for b.Loop() {
		lower := strings.ToLower(title)
		dst = dst[:0]
		for _, r := range rs {
			if r.Matches(lower, true) {
				dst = append(dst, r)
			}
		}
	}
}

func benchmarkMatched(rs []*Rule, title string) []*Rule {
	var out []*Rule
	for _, r := range rs {
		if r.Matches(title, true) {
			out = append(out, r)
		}
	}
	return out
}

func benchmarkMatcher(b *testing.B, rs []*Rule, title string) {
	m := NewMatcher(rs)
	if got := m.Match(title, true, nil); len(got) != len(benchmarkMatched(rs, title)) {
		b.Fatalf("Match gives %d rules, Matches %d", len(got), len(benchmarkMatched(rs, title)))
	}
	b.ReportAllocs()
	var dst []*Rule
	for b.Loop() {
		dst = m.Match(title, true, dst[:0])
	}
}

func BenchmarkMatchPathological(b *testing.B) {
	rs, title := attack(b)
	b.Run("Matches", func(b *testing.B) { benchmarkMatches(b, rs, title) })
	b.Run("Matcher", func(b *testing.B) { benchmarkMatcher(b, rs, title) })
}

func BenchmarkMatchNormal(b *testing.B) {
	rs, title := normal(b)
	b.Run("Matches", func(b *testing.B) { benchmarkMatches(b, rs, title) })
	b.Run("Matcher", func(b *testing.B) { benchmarkMatcher(b, rs, title) })
}

func BenchmarkNewMatcherPathological(b *testing.B) {
	rs, _ := attack(b)
	b.ReportAllocs()
	for b.Loop() {
		NewMatcher(rs)
	}
}
