package counter

import "sync"

// stateCache keeps the state strings this worker stored last, by group, so
// that a group counted again in the worker need not be read first: cas.lua
// checks the cached string's generation against Redis' and stores only if
// they agree, and answers the string Redis holds where they do not. A stale
// entry costs that answer, never a wrong count; the cache only saves reads.
//
// It is bounded by bytes in two generations: entries go into the young
// one, a hit in the old one moves up, and when the young one is full it
// becomes the old one and the old one is dropped. So it keeps at most
// twice the half of its bound that a generation holds, without an LRU list.
type stateCache struct {
	mu         sync.Mutex
	young, old map[string][]byte
	used, half int // bytes in young; a generation's bound
}

func newStateCache(bytes int64) *stateCache {
	if bytes <= 0 {
		return nil
	}
	return &stateCache{young: map[string][]byte{}, half: int(bytes / 2)}
}

// get returns a group's state as this worker stored it, if it still has it.
// The string is shared: callers only read it.
func (c *stateCache) get(base string) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.young[base]; ok {
		return s, true
	}
	s, ok := c.old[base]
	if ok {
		delete(c.old, base)
		c.putLocked(base, s)
	}
	return s, ok
}

// put keeps the state a group now has in Redis, written by this worker.
func (c *stateCache) put(base string, state []byte) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.old, base)
	c.putLocked(base, state)
}

// drop forgets a group whose state changed in a way this worker did not
// see the result of (observe.lua wrote it).
func (c *stateCache) drop(base string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.young[base]; ok {
		c.used -= len(base) + len(s)
		delete(c.young, base)
	}
	delete(c.old, base)
}

func (c *stateCache) putLocked(base string, state []byte) {
	if s, ok := c.young[base]; ok {
		c.used -= len(base) + len(s)
	}
	n := len(base) + len(state)
	if c.used+n > c.half {
		c.old, c.young, c.used = c.young, make(map[string][]byte, len(c.young)), 0
	}
	c.young[base] = state
	c.used += n
}
