package deliverer

import (
	"strconv"
	"testing"
	"time"
)

// A refused endpoint fails every firing of its rule: the log says so once
// per (project, rule, channel) an hour, and the memory of it stays bounded
// whatever the number of rules.
func TestRefusalsLoggedOncePerRuleAnHour(t *testing.T) {
	r := newRefusals()
	r.max = 3
	now := time.Now()
	if !r.first("p\x00r1\x00webhook", now) {
		t.Fatal("the first refusal is not logged")
	}
	for i := range 5 {
		if r.first("p\x00r1\x00webhook", now.Add(time.Duration(i)*time.Minute)) {
			t.Fatalf("refusal %d within the hour logged again", i+2)
		}
	}
	if !r.first("p\x00r1\x00slack", now) || !r.first("p\x00r2\x00webhook", now) {
		t.Error("another channel or rule is not logged")
	}
	if !r.first("p\x00r1\x00webhook", now.Add(time.Hour)) {
		t.Error("not logged again after an hour")
	}
	for i := range 100 {
		r.first("p\x00many"+strconv.Itoa(i)+"\x00webhook", now)
		if len(r.seen) > r.max {
			t.Fatalf("%d entries kept, bound %d", len(r.seen), r.max)
		}
	}
}
