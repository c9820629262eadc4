package rules

import (
	"slices"
	"strings"
)

// Matcher decides which of a project's rules an event matches, with exactly
// Rule.Matches' semantics, at a cost linear in the title whatever the words:
// one Aho–Corasick automaton over every filter word of every rule finds, in
// one pass over the lower-cased title, the set of words it contains, and
// each rule is decided from that set. Rule.Matches searches the title once
// per word: 100 rules × 50 words of "aaa…" against a title of "aaa…" cost
// 95 ms per event, stalling every project's events in the batch.
//
// A Matcher is immutable once built and safe for concurrent use. A nil
// Matcher has no rules.
type Matcher struct {
	rules   []*Rule
	filters []filter // parallel to rules
	groups  []*automaton
	words   int // distinct words of all groups; word ids are 0..words-1
}

// filter is a rule's title filter as word ids.
type filter struct {
	group     int // index in Matcher.groups; -1 when the rule has no words
	including []int32
	excluding []int32
}

// NewMatcher builds the matcher of rules, which keep their order. Rules
// compiled with different Limits.MatchedTitleBytes (not the case within
// one load) get one automaton per title length, so that each searches the
// same part of the title as Rule.Matches.
func NewMatcher(rs []*Rule) *Matcher {
	m := &Matcher{rules: rs, filters: make([]filter, len(rs))}
	var builders []*acBuilder
	for i, r := range rs {
		f := filter{group: -1}
		if len(r.including) > 0 || len(r.excluding) > 0 {
			f.group = slices.IndexFunc(builders, func(b *acBuilder) bool { return b.titleBytes == r.titleBytes })
			if f.group < 0 {
				f.group = len(builders)
				builders = append(builders, newACBuilder(r.titleBytes))
			}
			b := builders[f.group]
			for _, w := range r.including {
				f.including = append(f.including, b.add(w, &m.words))
			}
			for _, w := range r.excluding {
				f.excluding = append(f.excluding, b.add(w, &m.words))
			}
		}
		m.filters[i] = f
	}
	for _, b := range builders {
		m.groups = append(m.groups, b.build())
	}
	return m
}

// Rules returns the matcher's rules, in their order; nil for a nil Matcher.
// The caller must not modify them.
func (m *Matcher) Rules() []*Rule {
	if m == nil {
		return nil
	}
	return m.rules
}

// Len is the number of rules.
func (m *Matcher) Len() int { return len(m.Rules()) }

// smallWords is how many words Match keeps its scratch set of on the
// stack; a project with more allocates it (one bit per word).
const smallWords = 1024

// Match appends to dst the rules that an event with this title and newness
// matches, in the matcher's order, and returns it: the rules r for which
// r.Matches(title, isNew).
func (m *Matcher) Match(title string, isNew bool, dst []*Rule) []*Rule {
	if m == nil {
		return dst
	}
	var (
		small   [smallWords / 64]uint64
		present []uint64 // of every word, scanned on first need
	)
	for i, r := range m.rules {
		if r.OnlyNew && !isNew {
			continue
		}
		f := &m.filters[i]
		if f.group < 0 {
			dst = append(dst, r)
			continue
		}
		if present == nil {
			if n := (m.words + 63) / 64; n <= len(small) {
				present = small[:n]
			} else {
				present = make([]uint64, n)
			}
			for _, g := range m.groups {
				g.scan(strings.ToLower(cutTitle(title, g.titleBytes)), present)
			}
		}
		if f.matches(present) {
			dst = append(dst, r)
		}
	}
	return dst
}

func (f *filter) matches(set []uint64) bool {
	for _, w := range f.excluding {
		if has(set, w) {
			return false
		}
	}
	if len(f.including) == 0 {
		return true
	}
	for _, w := range f.including {
		if has(set, w) {
			return true
		}
	}
	return false
}

func has(set []uint64, w int32) bool { return set[w/64]&(1<<(w%64)) != 0 }

// automaton is an Aho–Corasick automaton over bytes, its transitions stored
// sparsely (memory in proportion to the words' bytes, which a project may
// have ~400 KB of) and the root's densely (most steps of a scan start there).
type automaton struct {
	titleBytes int
	root       [256]int32
	// Per node; node 0 is the root.
	edgeStart []int32 // node i's edges are edges[edgeStart[i]:edgeStart[i+1]]
	fail      []int32 // longest proper suffix that is a node
	dict      []int32 // longest proper suffix that ends a word, or -1
	word      []int32 // the word the node ends, or -1
	// Edges, sorted by label within a node.
	labels  []byte
	targets []int32
}

// next is the node reached from node by byte c, following failure links.
func (a *automaton) next(node int32, c byte) int32 {
	for node != 0 {
		if t := a.child(node, c); t >= 0 {
			return t
		}
		node = a.fail[node]
	}
	return a.root[c]
}

// child is node's edge labelled c, or -1.
func (a *automaton) child(node int32, c byte) int32 {
	if node == 0 {
		if t := a.root[c]; t != 0 {
			return t
		}
		return -1
	}
	lo, hi := a.edgeStart[node], a.edgeStart[node+1]
	for lo < hi { // binary search; most nodes have one edge
		mid := int32(uint32(lo+hi) >> 1)
		switch l := a.labels[mid]; {
		case l == c:
			return a.targets[mid]
		case l < c:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}

// scan sets in set the bit of every word that occurs in text. Each step
// reports the words ending there by walking dictionary links, and stops at
// the first word already reported (its own suffixes were reported with
// it): the cost is the text's length plus the number of distinct words,
// not the number of occurrences, which runs of one letter make quadratic.
func (a *automaton) scan(text string, set []uint64) {
	var node int32
	for i := 0; i < len(text); i++ {
		node = a.next(node, text[i])
		w := node
		if a.word[w] < 0 {
			w = a.dict[w]
		}
		for w > 0 {
			id := a.word[w]
			if has(set, id) {
				break
			}
			set[id/64] |= 1 << (id % 64)
			w = a.dict[w]
		}
	}
}

// acBuilder collects the distinct words of one automaton.
type acBuilder struct {
	titleBytes int
	ids        map[string]int32
	words      []string // in the order of their ids
}

func newACBuilder(titleBytes int) *acBuilder {
	return &acBuilder{titleBytes: titleBytes, ids: map[string]int32{}}
}

// add returns the id of word, giving it the next id of *count if new: ids
// are unique across the automatons of a Matcher.
func (b *acBuilder) add(word string, count *int) int32 {
	if id, ok := b.ids[word]; ok {
		return id
	}
	id := int32(*count)
	*count++
	b.ids[word] = id
	b.words = append(b.words, word)
	return id
}

func (b *acBuilder) build() *automaton {
	// The trie, its edges keyed by (parent, label) while it grows.
	type edge struct {
		parent int32
		label  byte
		child  int32
	}
	children := map[uint64]int32{}
	var edges []edge
	word := []int32{-1}
	for _, w := range b.words {
		var node int32
		for i := 0; i < len(w); i++ {
			key := uint64(node)<<8 | uint64(w[i])
			next, ok := children[key]
			if !ok {
				next = int32(len(word))
				children[key] = next
				edges = append(edges, edge{node, w[i], next})
				word = append(word, -1)
			}
			node = next
		}
		word[node] = b.ids[w] // words are distinct: one id per node
	}
	slices.SortFunc(edges, func(x, y edge) int {
		if x.parent != y.parent {
			return int(x.parent - y.parent)
		}
		return int(x.label) - int(y.label)
	})
	n := len(word)
	a := &automaton{
		titleBytes: b.titleBytes,
		edgeStart:  make([]int32, n+1),
		fail:       make([]int32, n),
		dict:       make([]int32, n),
		word:       word,
		labels:     make([]byte, len(edges)),
		targets:    make([]int32, len(edges)),
	}
	for i, e := range edges {
		a.edgeStart[e.parent+1]++
		a.labels[i], a.targets[i] = e.label, e.child
		if e.parent == 0 {
			a.root[e.label] = e.child
		}
	}
	for i := 1; i <= n; i++ {
		a.edgeStart[i] += a.edgeStart[i-1]
	}
	// Failure and dictionary links, breadth first: a node's links depend
	// only on shallower nodes'.
	a.dict[0] = -1
	queue := []int32{0}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for e := a.edgeStart[u]; e < a.edgeStart[u+1]; e++ {
			c, v := a.labels[e], a.targets[e]
			if u != 0 {
				a.fail[v] = a.next(a.fail[u], c)
			}
			f := a.fail[v]
			if a.word[f] >= 0 {
				a.dict[v] = f
			} else {
				a.dict[v] = a.dict[f]
			}
			queue = append(queue, v)
		}
	}
	return a
}
