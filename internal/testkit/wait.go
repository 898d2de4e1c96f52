package testkit

import (
	"testing"
	"time"
)

// poll is how often Eventually checks its condition.
const poll = 5 * time.Millisecond

// Eventually checks cond every few milliseconds until it holds, and fails the test naming
// what it waited for if it does not hold within the bound.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(poll) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; it did not happen", within, what)
		}
	}
}
