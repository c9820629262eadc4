package counter

import (
	"fmt"
	"testing"
)

// The cache holds at most its bound, keeps what is used, and forgets what
// it is told changed.
func TestStateCacheBounded(t *testing.T) {
	c := newStateCache(10_000)
	state := make([]byte, 90)
	for i := range 1000 {
		c.put(fmt.Sprint("g", i), state)
		if i%10 == 0 {
			c.get("g0") // used all along: kept
		}
		held := 0
		for _, gen := range []map[string][]byte{c.young, c.old} {
			for k, v := range gen {
				held += len(k) + len(v)
			}
		}
		if held > 10_000 {
			t.Fatalf("after %d puts the cache holds %d bytes, over its bound of 10000", i+1, held)
		}
	}
	if _, ok := c.get("g0"); !ok {
		t.Error("a state read all along was dropped")
	}
	if _, ok := c.get("g1"); ok {
		t.Error("the cache still holds the second of 1,000 states of 100 bytes in 10,000")
	}
	if _, ok := c.get("g999"); !ok {
		t.Error("the last state put is not held")
	}
	c.drop("g999")
	if _, ok := c.get("g999"); ok {
		t.Error("a dropped state is still held")
	}
	if newStateCache(0) != nil {
		t.Error("a cache of no bytes is made")
	}
	var none *stateCache
	none.put("g", state) // no cache: nothing held, nothing fails
	if _, ok := none.get("g"); ok {
		t.Error("no cache holds a state")
	}
}
