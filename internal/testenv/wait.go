package testenv

import (
	"testing"
	"time"
)

// pollInterval is how often WaitFor and Eventually ask again: often enough
// that a test waits for no more than it must, rarely enough to leave the
// machine to the code under test.
const pollInterval = 10 * time.Millisecond

// WaitFor polls cond until it holds. If it does not within timeout, the
// test fails, saying what it waited for (what, such as "3 acks") and how
// long.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Eventually polls cond until it holds, and reports whether it did within
// timeout: WaitFor for a test that says itself what it saw instead.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval) // polling a condition with a deadline
	}
	return true
}
