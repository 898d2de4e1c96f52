package writeback_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/writeback"
)

// stallingLedger is the ledger on the service's own store whose first write stalls, deaf to
// its context, until woken: a writeback process paused by the OS mid-write.
type stallingLedger struct {
	*writeback.Ledger
	stalled       atomic.Bool
	entered, wake chan struct{}
}

func (l *stallingLedger) WriteReceipt(ctx context.Context, w writeback.WriteInput, key, owner string, ttl time.Duration, receipt func(string) ([]byte, error)) (string, error) {
	if l.stalled.CompareAndSwap(false, true) {
		close(l.entered)
		<-l.wake
	}
	return l.Ledger.WriteReceipt(ctx, w, key, owner, ttl, receipt)
}

// TestLapsedWriteRefused: write A stalls past its pending claim; write B of the same key
// claims it and writes the ledger entry and its receipt. A wakes and writes: its write names
// its own, lapsed claim, so it is refused (Aborted) in the same transaction, before the
// ledger: the ledger holds one entry, offered once, and the key's receipt is B's, which a
// repeat gets back.
func TestLapsedWriteRefused(t *testing.T) {
	const ttl = 200 * time.Millisecond
	sl := &stallingLedger{entered: make(chan struct{}), wake: make(chan struct{})}
	e := newEnv(t, envOpts{
		targets: func(st *store.Bolt) []writeback.Target {
			sl.Ledger = writeback.NewLedger(st)
			return []writeback.Target{sl}
		},
		mod: func(o *writeback.Options) { o.PendingTTL = ttl },
	})
	ctx := ctxT(t)
	aErr := make(chan error, 1)
	go func() {
		_, err := e.client.Write(ctx, e.req())
		aErr <- err
	}()
	<-sl.entered
	time.Sleep(ttl + 100*time.Millisecond) // A's claim lapses
	b, err := e.client.Write(ctx, e.req())
	if err != nil || b.GetDuplicate() {
		t.Fatalf("B's write after A's claim lapsed = %v, %v; want a write of its own", b, err)
	}
	close(sl.wake)
	err = <-aErr
	if status.Code(err) != codes.Aborted || !strings.Contains(status.Convert(err).Message(), "lapsed") {
		t.Fatalf("A's late write = %v; want Aborted, naming its lapsed claim", err)
	}
	entries := e.ledger(t)
	if len(entries) != 1 || entries[0].Offers != 1 || entries[0].ID != b.GetReceipt().GetExternalId() {
		t.Fatalf("ledger %+v; want B's one entry %s, offered once (A's write refused before it)", entries, b.GetReceipt().GetExternalId())
	}
	st, v, err := e.st.Lookup(ctx, wantKey)
	var rec handoffv1.WriteResponse
	if err != nil || st != store.Done || proto.Unmarshal(v, &rec) != nil {
		t.Fatalf("record = %v, %v; want done", st, err)
	}
	testkit.Equal(t, rec.GetReceipt(), b.GetReceipt(), "the key's receipt")
	again, err := e.client.Write(ctx, e.req())
	if err != nil || !again.GetDuplicate() {
		t.Fatalf("repeat = %v, %v; want B's receipt, duplicate", again, err)
	}
	testkit.Equal(t, again.GetReceipt(), b.GetReceipt(), "the repeat's receipt")
}
