package suggest

import "testing"

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"RULE_FILE", "RULES_FILE", 1}, {"same", "same", 0}} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// A slip gets its word back; something unrelated gets no guess, which
// would only mislead.
func TestClosest(t *testing.T) {
	channels := []string{"email", "telegram", "slack", "loop", "webhook"}
	for _, c := range []struct{ word, want string }{
		{"slak", "slack"}, {"webhok", "webhook"}, {"emial", "email"}, {"telgram", "telegram"},
		{"pagerduty", ""}, {"slack", ""}, {"", ""},
		{"SMTP_PASS", ""}, // not among these candidates
	} {
		if got := Closest(c.word, channels); got != c.want {
			t.Errorf("Closest(%q) = %q, want %q", c.word, got, c.want)
		}
	}
	if got := Closest("SMTP_PASS", []string{"SMTP_TLS", "SMTP_PASSWORD"}); got != "SMTP_PASSWORD" {
		t.Errorf("a shortened name: got %q, want SMTP_PASSWORD", got)
	}
}
