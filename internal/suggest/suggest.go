// Package suggest finds the word someone most likely meant: the "did you
// mean" of a misspelt variable, command, channel or field name.
package suggest

import "strings"

// Closest is the candidate nearest to word by edit distance, "" when even
// that one differs in more than a third of word's letters (at least two
// edits are always allowed): then word is no misspelling but something
// else. A candidate that word starts (a shortened name, such as SMTP_PASS
// for SMTP_PASSWORD) counts as one edit away, a likelier slip than other
// letters. Ties go to the earlier candidate.
func Closest(word string, candidates []string) string {
	if word == "" {
		return ""
	}
	best, bestDist := "", -1
	for _, c := range candidates {
		d := Distance(word, c)
		if strings.HasPrefix(c, word) {
			d = min(d, 1)
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	if bestDist < 0 || bestDist == 0 || bestDist > max(2, len(word)/3) {
		return ""
	}
	return best
}

// Distance is the Levenshtein distance of a and b: insertions, deletions
// and substitutions of one byte each (the names compared are ASCII).
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
