// Package crashpoint marks the places between the writeback's claim of a key and its
// receipt where a crash leaves a write half done, so that a test can SIGKILL a real process
// at exactly that place and see what a restart makes of it.
//
// A normal build has no crash points: Hit is an empty function. Only a binary built with
// `go build -tags crashpoints` has them, and even then only when the environment variable
// HANDOFF_CRASHPOINT_HOOK holds the URL of a hook (a test's HTTP server on loopback, see
// Serve). At each Hit the process POSTs a Visit to the hook and waits for its answer; the
// test either SIGKILLs the process meanwhile (the answer never comes) or answers, and the
// process goes on. cmd/writeback's crash test and `handoff chaos` use it.
package crashpoint

// The crash points, in the order a write passes them.
const (
	// AfterClaim: the idempotency key is claimed (a pending marker with the pending TTL);
	// nothing is written yet.
	AfterClaim = "after-claim"
	// InWrite: inside the transaction that writes the ledger entry and the receipt
	// together (on bbolt inside the write transaction; on Redis just before its script).
	// Only writes whose target shares the idempotency store pass it.
	InWrite = "in-write"
	// AfterWrite: the target has written; when it shares the idempotency store the
	// receipt is stored too, otherwise the receipt is still to be stored.
	AfterWrite = "after-write"
	// AfterReceipt: the receipt is stored and the answer not yet sent.
	AfterReceipt = "after-receipt"
)

// Points are the crash points in order.
var Points = []string{AfterClaim, InWrite, AfterWrite, AfterReceipt}

// HookEnv is the environment variable that holds the hook's URL.
const HookEnv = "HANDOFF_CRASHPOINT_HOOK"

// Visit is what the hook receives at each Hit.
type Visit struct {
	Point string `json:"point"`
	// Key is the idempotency key of the write passing the point.
	Key string `json:"key"`
	// PID is the process's id.
	PID int `json:"pid"`
}
