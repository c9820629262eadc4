package rules

import (
	"strings"
	"testing"
)

// The zero Limits are the defaults, which a real Hawk rule never meets: the
// limits stop abuse, not users.
func TestDefaultLimits(t *testing.T) {
	words := func(n, size int) []string {
		w := make([]string, n)
		for i := range w {
			w[i] = strings.Repeat(string(rune('a'+i%26)), size)
		}
		return w
	}
	ok := Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: hook(),
		Including: words(DefaultFilterWords, 40), Excluding: words(DefaultFilterWords, 40)}
	if _, _, err := Compile("p", ok); err != nil {
		t.Errorf("a rule within the default limits: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"too many words", func(s *Spec) { s.Excluding = words(DefaultFilterWords+1, 5) }, "excluding has 51 words: at most 50"},
		{"word too long", func(s *Spec) { s.Including = words(1, DefaultFilterWordBytes+1) }, "including[0] is 201 bytes long"},
		{"filters too big", func(s *Spec) { s.Including, s.Excluding = words(11, 200), words(10, 200) }, "add up to 4200 bytes: at most 4096"},
		{"too many windows", func(s *Spec) {
			s.WhatToReceive = SeenMore
			for i := range MaxWindowsPerRule + 1 {
				s.Windows = append(s.Windows, WindowSpec{Threshold: int64(i + 1), Period: 1000})
			}
		}, "9 windows: at most 8"},
	} {
		s := ok
		s.Including, s.Excluding = nil, nil
		tc.edit(&s)
		if _, _, err := Compile("p", s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// A limit above the hard maximum is the maximum: the counter's script
	// takes 8 windows at most.
	s := ok
	s.WhatToReceive, s.Windows = SeenMore, make([]WindowSpec, 9)
	if _, _, err := (Limits{WindowsPerRule: 100}).Compile("p", s); err == nil || !strings.Contains(err.Error(), "at most 8") {
		t.Errorf("9 windows with WindowsPerRule 100: %v", err)
	}
}

// Matching costs words × title length: 100 rules of 1,000 words against
// 200 KB titles took 29 s for 20 events. Filters search the start of a
// title only, far longer than any title a person reads.
func TestFiltersSearchTheStartOfATitle(t *testing.T) {
	r, _, err := Limits{MatchedTitleBytes: 100}.Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew,
		Channels: hook(), Excluding: []string{"staging"}})
	if err != nil {
		t.Fatal(err)
	}
	head := strings.Repeat("é", 49) + "x" // 99 bytes, then a 2-byte character across the cut
	if !r.Matches(head+"é staging", true) {
		t.Error("a word after the searched part excluded the event")
	}
	if r.Matches("staging "+head, true) {
		t.Error("a word inside the searched part did not exclude the event")
	}
	if d, _, _ := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: hook(),
		Including: []string{"db"}}); d.Matches(strings.Repeat("x", DefaultMatchedTitleBytes)+"db", true) {
		t.Error("the default searches more than DefaultMatchedTitleBytes")
	}
}

func TestRecipients(t *testing.T) {
	for endpoint, want := range map[string]int{
		"a@x.io":                          1,
		"a@x.io, Bob <b@y.io>":            2,
		`"Doe, John" <j@x.io>, c@x.io`:    2,
		"a@x.io,, b@x.io, not an address": 3,
	} {
		if got := Recipients(endpoint); got != want {
			t.Errorf("Recipients(%q) = %d, want %d", endpoint, got, want)
		}
	}
}
