package idempotency_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
)

// stallingWriteback's first write stalls, deaf to its context, until woken: a process paused
// by the OS mid-write. Each write answers the external id of its call.
type stallingWriteback struct {
	handoffv1.UnimplementedWritebackServiceServer
	calls         atomic.Int32
	entered, wake chan struct{}
}

func (s *stallingWriteback) Write(ctx context.Context, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	n := s.calls.Add(1)
	if n == 1 {
		close(s.entered)
		<-s.wake
	}
	key, _ := writeKey(req)
	return &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{IdempotencyKey: key, ExternalId: fmt.Sprintf("ext-%d", n)}}, nil
}

// TestLapsedHolderCompletionRefused: call A's handler stalls past its pending claim; call B
// of the same key claims it, and its result is stored. A's handler then returns: the
// interceptor's Complete names A's lapsed claim and is refused (ErrNotOwner, not retried),
// A gets Aborted, and B's result stays the key's, stored once; a repeat gets it back.
func TestLapsedHolderCompletionRefused(t *testing.T) {
	for name, open := range map[string]func(testing.TB) store.Idempotency{
		"bolt":  func(t testing.TB) store.Idempotency { return openBolt(t) },
		"redis": func(t testing.TB) store.Idempotency { return openRedis(t) },
	} {
		t.Run(name, func(t *testing.T) {
			const ttl = 200 * time.Millisecond
			fs := &faultStore{Idempotency: open(t)}
			h := &stallingWriteback{entered: make(chan struct{}), wake: make(chan struct{})}
			conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterWritebackServiceServer(s, h) },
				[]grpc.UnaryServerInterceptor{idempotency.UnaryServerInterceptor(fs, writeOpts(idempotency.WithPendingTTL(ttl))...)}, nil)
			c := handoffv1.NewWritebackServiceClient(conn)
			ctx := context.Background()
			aErr := make(chan error, 1)
			go func() {
				_, err := c.Write(ctx, writeReq("job-own"))
				aErr <- err
			}()
			<-h.entered
			time.Sleep(ttl + 100*time.Millisecond) // A's claim lapses
			b, err := c.Write(ctx, writeReq("job-own"))
			if err != nil || b.GetReceipt().GetExternalId() != "ext-2" || b.GetDuplicate() {
				t.Fatalf("B's call after A's claim lapsed = %v, %v; want its own write ext-2", b, err)
			}
			close(h.wake)
			err = <-aErr
			wantCode(t, err, codes.Aborted, "lapsed")
			if n := fs.completes.Load(); n != 2 {
				t.Errorf("%d Completes; want 2 (B's, and A's one refused attempt, not retried)", n)
			}
			key, _ := writeKey(writeReq("job-own"))
			st, v := lookup(t, fs, key)
			var rec handoffv1.WriteResponse
			if st != store.Done || proto.Unmarshal(v, &rec) != nil || rec.GetReceipt().GetExternalId() != "ext-2" {
				t.Fatalf("record = %v %v; want done with B's ext-2", st, rec.GetReceipt())
			}
			again, err := c.Write(ctx, writeReq("job-own"))
			if err != nil || !again.GetDuplicate() || again.GetReceipt().GetExternalId() != "ext-2" {
				t.Fatalf("repeat = %v, %v; want B's ext-2, duplicate", again, err)
			}
			if n := h.calls.Load(); n != 2 {
				t.Errorf("handler ran %d times; want 2 (A and B, not the repeat)", n)
			}
		})
	}
}

// TestClaimWithoutOwnerRefused: a claim function that reports Claimed without an owner token
// (a store or admission that lost it) fails closed: Internal, naming the key, the handler
// not run, since such a claim could be neither completed nor renewed.
func TestClaimWithoutOwnerRefused(t *testing.T) {
	f := &fakeRunner{}
	claim := func(context.Context, proto.Message, string, time.Duration) (store.ClaimState, []byte, string, func(context.Context) context.Context, error) {
		return store.Claimed, nil, "", nil, nil
	}
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(s, f) },
		nil, []grpc.StreamServerInterceptor{idempotency.StreamServerInterceptor(openBolt(t),
			idempotency.WithStreamKey(deliverMethod, nil, deliverKey),
			idempotency.WithStreamReplay(deliverMethod, deliverReplay),
			idempotency.WithStreamRecord(deliverMethod, deliverRecord),
			idempotency.WithStreamClaim(deliverMethod, claim),
			idempotency.WithLogger(quiet))})
	_, err := deliver(context.Background(), handoffv1.NewAgentRunnerServiceClient(conn), deliverReq("job-noowner"))
	key, _ := deliverKey(deliverReq("job-noowner"))
	wantCode(t, err, codes.Internal, "claim "+key+": claimed without an owner token")
	if n := f.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times; want 0", n)
	}
}
