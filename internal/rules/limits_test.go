package rules

import (
	"fmt"
	"slices"
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

// An endpoint travels in every delivery job of its rule: a 3 MB webhook
// URL made every firing a 3 MB message, past what the broker takes. Such a
// channel is left out with a warning naming the channel, the length and
// the limit, never the endpoint; the rule's other channels keep working.
func TestOverlongEndpointLeavesItsChannelOut(t *testing.T) {
	huge := "https://example.com/" + strings.Repeat("a", 3<<20)
	for _, tc := range []struct {
		channel, endpoint string
		limit             int
	}{
		{Webhook, huge, MaxURLEndpointBytes},
		{Slack, "https://hooks.slack.com/services/" + strings.Repeat("b", MaxURLEndpointBytes), MaxURLEndpointBytes},
		{Telegram, "-100" + strings.Repeat("1", MaxURLEndpointBytes), MaxURLEndpointBytes},
		{Loop, huge, MaxURLEndpointBytes},
		{Email, "a@example.com," + strings.Repeat(" ", 100) + strings.Repeat("x", 3200) + "@example.com", DefaultEmailRecipients * MaxAddressBytes},
	} {
		channels := map[string]ChannelSpec{
			tc.channel: {IsEnabled: true, Endpoint: tc.endpoint},
			Webhook:    {IsEnabled: true, Endpoint: "http://127.0.0.1/h"},
		}
		if tc.channel == Webhook {
			channels[Slack] = ChannelSpec{IsEnabled: true, Endpoint: "https://hooks.slack.com/services/T/B/x"}
		}
		r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: channels})
		if err != nil {
			t.Fatalf("%s: %v", tc.channel, err)
		}
		n := len(strings.TrimSpace(tc.endpoint))
		want := fmt.Sprintf("channel %s: endpoint is %d bytes long, over the limit of %d: left out", tc.channel, n, tc.limit)
		if !slices.Contains(warnings, want) {
			t.Errorf("%s: warnings %.300q, want %q", tc.channel, warnings, want)
		}
		for _, w := range warnings {
			if strings.Contains(w, "aaaa") || strings.Contains(w, "xxxx") || strings.Contains(w, "example.com") {
				t.Errorf("%s: a warning repeats the endpoint: %.200s", tc.channel, w)
			}
		}
		if len(r.Channels) != 1 || r.Channels[0].Name == tc.channel {
			t.Errorf("%s: channels %v, want the other channel alone", tc.channel, channelNames(r))
		}
	}
	// At the limit, an endpoint is taken.
	at := "https://example.com/" + strings.Repeat("a", MaxURLEndpointBytes-len("https://example.com/"))
	r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew,
		Channels: map[string]ChannelSpec{Webhook: {IsEnabled: true, Endpoint: at}}})
	if err != nil || len(warnings) != 0 || len(r.Channels) != 1 {
		t.Errorf("an endpoint of %d bytes: %v, %q", len(at), err, warnings)
	}
	if got := (Limits{EmailRecipients: 2}).EndpointBytes(Email); got != 2*MaxAddressBytes {
		t.Errorf("email endpoint bound with 2 recipients: %d", got)
	}
}

func channelNames(r *Rule) []string {
	var names []string
	for _, c := range r.Channels {
		names = append(names, c.Name)
	}
	return names
}
