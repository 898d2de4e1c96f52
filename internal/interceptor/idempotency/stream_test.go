package idempotency_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop/hoptest"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
)

const (
	accepted  = handoffv1.AckStatus_ACK_STATUS_ACCEPTED
	duplicate = handoffv1.AckStatus_ACK_STATUS_DUPLICATE
)

// TestDeliverThenRedeliver: the first delivery runs (ACCEPTED, then the result); a
// re-delivery gets one DUPLICATE ack carrying the first result, and the handler is not called.
func TestDeliverThenRedeliver(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{}
	c := runnerClient(t, st, f)
	ctx := context.Background()

	first, err := deliver(ctx, c, deliverReq("job-d"))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 || ackStatus(first) != accepted || first[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("first delivery = %v; want ACCEPTED then a COMPLETED result", first)
	}
	if f.lastJob.Load() != "job-d" {
		t.Errorf("handler read job %v; want the request the interceptor handed it", f.lastJob.Load())
	}
	again, err := deliver(ctx, c, deliverReq("job-d"))
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || ackStatus(again) != duplicate {
		t.Fatalf("re-delivery = %v; want one DUPLICATE ack", again)
	}
	prior := again[0].GetAck().GetPrior()
	testkit.Equal(t, &handoffv1.PriorResult{Artifacts: prior.GetArtifacts(), NextHint: prior.GetNextHint()},
		&handoffv1.PriorResult{Artifacts: first[1].GetResult().GetArtifacts(), NextHint: first[1].GetResult().GetNextHint()}, "the prior result (the first run's)")
	if again[0].GetAck().GetJobId() != "job-d" {
		t.Errorf("DUPLICATE ack names job %q", again[0].GetAck().GetJobId())
	}
	if f.calls.Load() != 1 {
		t.Errorf("handler ran %d times; want 1", f.calls.Load())
	}
}

// TestConcurrentDeliveries: 20 deliveries of one stage at once run it once.
func TestConcurrentDeliveries(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{delay: 100 * time.Millisecond}
	c := runnerClient(t, st, f, idempotency.WithRetryDelay(20*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	got := make([][]*handoffv1.DeliverResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], _, errs[i] = retrying(ctx, func() ([]*handoffv1.DeliverResponse, error) {
				return deliver(ctx, c, deliverReq("job-20"))
			})
		}()
	}
	close(start)
	wg.Wait()

	ran, dups := 0, 0
	var result *handoffv1.StageResult
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("delivery %d: %v", i, errs[i])
		}
		switch ackStatus(got[i]) {
		case accepted:
			ran++
			result = got[i][1].GetResult()
		case duplicate:
			dups++
		default:
			t.Fatalf("delivery %d: %v", i, got[i])
		}
	}
	if ran != 1 || dups != n-1 || f.calls.Load() != 1 {
		t.Fatalf("%d ran, %d duplicates, %d handler calls; want 1, %d, 1", ran, dups, f.calls.Load(), n-1)
	}
	for i := range n {
		if ackStatus(got[i]) == duplicate && got[i][0].GetAck().GetPrior().GetNextHint() != result.GetNextHint() {
			t.Errorf("delivery %d replayed %v; want the one run's result", i, got[i][0].GetAck().GetPrior())
		}
	}
}

// TestFailedResultReleases: a FAILED result frees the key, so the retry runs the stage again.
func TestFailedResultReleases(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{}
	f.failFirst.Store(1)
	c := runnerClient(t, st, f)
	ctx := context.Background()

	first, err := deliver(ctx, c, deliverReq("job-f"))
	if err != nil || len(first) != 2 || first[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_FAILED {
		t.Fatalf("first delivery = %v, %v; want ACCEPTED then FAILED", first, err)
	}
	if state, _ := lookup(t, st, "stage:job-f:draft:1"); state != 0 {
		t.Fatalf("after FAILED the key is %v; want released", state)
	}
	second, err := deliver(ctx, c, deliverReq("job-f"))
	if err != nil || ackStatus(second) != accepted || second[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("retry = %v, %v; want a fresh run that completes", second, err)
	}
	third, err := deliver(ctx, c, deliverReq("job-f"))
	if err != nil || ackStatus(third) != duplicate {
		t.Fatalf("after completion = %v, %v; want DUPLICATE", third, err)
	}
	if f.calls.Load() != 2 {
		t.Errorf("handler ran %d times; want 2", f.calls.Load())
	}
}

// TestHandlerWithoutResultReleases: a handler that ends without a result frees the key.
func TestHandlerWithoutResultReleases(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{}
	f.errFirst.Store(1)
	c := runnerClient(t, st, f)
	ctx := context.Background()

	msgs, err := deliver(ctx, c, deliverReq("job-e"))
	wantCode(t, err, codes.Internal, "agent lost")
	if ackStatus(msgs) != accepted {
		t.Errorf("messages before the error: %v; want the ACCEPTED ack", msgs)
	}
	if state, _ := lookup(t, st, "stage:job-e:draft:1"); state != 0 {
		t.Fatalf("key is %v; want released", state)
	}
	if again, err := deliver(ctx, c, deliverReq("job-e")); err != nil || len(again) != 2 || f.calls.Load() != 2 {
		t.Fatalf("retry = %v, %v (%d runs); want a second run", again, err, f.calls.Load())
	}
}

// TestDeliverCallerCancels: the caller hangs up after the ack; the stage still finishes and
// is recorded, and the re-delivery gets it as DUPLICATE.
func TestDeliverCallerCancels(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{started: make(chan struct{}, 1), proceed: make(chan struct{})}
	c := runnerClient(t, st, f, idempotency.WithRetryDelay(10*time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.Deliver(ctx, deliverReq("job-c"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetAck().GetStatus() != accepted {
		t.Fatalf("first message %v, %v; want ACCEPTED", m, err)
	}
	<-f.started
	cancel()
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the cancelled stream delivered a result")
	}
	_, err = deliver(context.Background(), c, deliverReq("job-c"))
	wantCode(t, err, codes.Aborted, "request with idempotency key stage:job-c:draft:1 is in flight")

	close(f.proceed)
	waitDone(t, st, "stage:job-c:draft:1")
	msgs, _, err := retrying(context.Background(), func() ([]*handoffv1.DeliverResponse, error) {
		return deliver(context.Background(), c, deliverReq("job-c"))
	})
	if err != nil || ackStatus(msgs) != duplicate || msgs[0].GetAck().GetPrior().GetNextHint() != "run 1" {
		t.Fatalf("re-delivery = %v, %v; want DUPLICATE of run 1", msgs, err)
	}
	if f.calls.Load() != 1 {
		t.Errorf("handler ran %d times; want 1", f.calls.Load())
	}
}

// TestDeliverCompleteFailure: a result that cannot be recorded ends the call Unavailable
// and leaves the key claimed, so a re-delivery is refused rather than run again. Stored
// before the send (the default), the result is not sent; with WithStreamRecordAfterSend it
// was sent first.
func TestDeliverCompleteFailure(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(map[bool]string{false: "before", true: "after"}[after], func(t *testing.T) {
			fs := &faultStore{Idempotency: openBolt(t), completeErr: errors.New("disk full")}
			f := &fakeRunner{}
			var opts []idempotency.StreamOption
			wantMsgs := 1 // the ACCEPTED ack only
			if after {
				opts, wantMsgs = append(opts, idempotency.WithStreamRecordAfterSend(deliverMethod)), 2
			}
			c := runnerClient(t, fs, f, opts...)
			msgs, err := deliver(context.Background(), c, deliverReq("job-cf"))
			wantCode(t, err, codes.Unavailable, "could not be stored: disk full")
			if len(msgs) != wantMsgs || ackStatus(msgs) != accepted {
				t.Errorf("messages %v; want %d: the ACCEPTED ack (and, sent first, the result)", msgs, wantMsgs)
			}
			_, err = deliver(context.Background(), c, deliverReq("job-cf"))
			wantCode(t, err, codes.Aborted, "is in flight")
			if f.calls.Load() != 1 || fs.releases.Load() != 0 {
				t.Errorf("%d runs, %d releases; want 1, 0", f.calls.Load(), fs.releases.Load())
			}
		})
	}
}

// TestStreamTable drives the stream interceptor directly with a fake stream and a handler
// that counts its calls.
func TestStreamTable(t *testing.T) {
	const key = "stage:job-t:draft:1"
	cases := []struct {
		name   string
		method string
		recv   []proto.Message // what the client sent
		fault  func(*faultStore)
		seed   func(t *testing.T, st store.Idempotency)
		code   codes.Code
		msg    string
		calls  int
		sent   int
	}{
		{name: "unkeyed method passes through", method: "/handoff.v1.CoordinatorService/WatchJob", calls: 1, sent: 2},
		{name: "missing request", recv: []proto.Message{}, code: codes.InvalidArgument, msg: deliverMethod + ": the request message is missing"},
		{name: "key error", recv: []proto.Message{&handoffv1.DeliverRequest{}}, code: codes.InvalidArgument,
			msg: "idempotency key: package.job_id and package.stage are required"},
		{name: "claim failure", fault: func(fs *faultStore) { fs.claimErr = errors.New("down") }, code: codes.Unavailable,
			msg: "idempotency store: claim " + key + ": down"},
		{name: "pending", seed: func(t *testing.T, st store.Idempotency) { seedPending(t, st, key) }, code: codes.Aborted,
			msg: "request with idempotency key " + key + " is in flight; retry in 1s"},
		{name: "done replays one message", sent: 1, seed: func(t *testing.T, st store.Idempotency) {
			seedDone(t, st, key, &handoffv1.PriorResult{NextHint: "stored"})
		}},
		{name: "unreadable stored value", code: codes.Internal, msg: "idempotency: replaying the stored result for key " + key, seed: func(t *testing.T, st store.Idempotency) {
			owner := seedPending(t, st, key)
			if err := st.Complete(context.Background(), key, owner, []byte{0xff, 0xff}, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "claimed runs the handler", calls: 1, sent: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := &faultStore{Idempotency: openBolt(t)}
			if c.seed != nil {
				c.seed(t, fs.Idempotency)
			}
			if c.fault != nil {
				c.fault(fs)
			}
			if c.method == "" {
				c.method = deliverMethod
			}
			if c.recv == nil {
				c.recv = []proto.Message{deliverReq("job-t")}
			}
			ss := &hoptest.Stream{Ctx: context.Background(), In: c.recv}
			calls := 0
			handler := func(_ any, s grpc.ServerStream) error {
				calls++
				req := &handoffv1.DeliverRequest{}
				if err := s.RecvMsg(req); err != nil {
					return err
				}
				if c.method == deliverMethod {
					if req.GetPackage().GetJobId() != "job-t" {
						t.Errorf("handler read %v", req)
					}
					if err := s.RecvMsg(&handoffv1.DeliverRequest{}); err != io.EOF {
						t.Errorf("second RecvMsg = %v; want io.EOF", err)
					}
					if err := s.RecvMsg(&handoffv1.CheckRequest{}); err != io.EOF {
						t.Errorf("third RecvMsg = %v; want io.EOF", err)
					}
				}
				var f fakeRunner
				return f.Deliver(req, &grpc.GenericServerStream[handoffv1.DeliverRequest, handoffv1.DeliverResponse]{ServerStream: s})
			}
			intercept := idempotency.StreamServerInterceptor(fs, deliverOpts()...)
			err := intercept(nil, ss, &grpc.StreamServerInfo{FullMethod: c.method, IsServerStream: true}, handler)
			wantCode(t, err, c.code, "")
			if c.msg != "" && !strings.HasPrefix(status.Convert(err).Message(), c.msg) {
				t.Errorf("error %v; want message %q", err, c.msg)
			}
			if calls != c.calls || len(ss.Sent) != c.sent {
				t.Errorf("%d handler calls, %d sent; want %d, %d", calls, len(ss.Sent), c.calls, c.sent)
			}
		})
	}
}

// TestStreamHandlerMessageMismatch: a handler reading another type gets Internal.
func TestStreamHandlerMessageMismatch(t *testing.T) {
	fs := &faultStore{Idempotency: openBolt(t)}
	ss := &hoptest.Stream{Ctx: context.Background(), In: []proto.Message{deliverReq("job-m")}}
	intercept := idempotency.StreamServerInterceptor(fs, deliverOpts()...)
	err := intercept(nil, ss, &grpc.StreamServerInfo{FullMethod: deliverMethod, IsServerStream: true},
		func(_ any, s grpc.ServerStream) error { return s.RecvMsg(&handoffv1.CheckRequest{}) })
	wantCode(t, err, codes.Internal, "the handler reads")
	if state, _ := lookup(t, fs, "stage:job-m:draft:1"); state != 0 {
		t.Errorf("key is %v; want released", state)
	}
}

// TestStreamClientStreamingRefused: a keyed method served as client-streaming is refused.
func TestStreamClientStreamingRefused(t *testing.T) {
	fs := &faultStore{Idempotency: openBolt(t)}
	intercept := idempotency.StreamServerInterceptor(fs, deliverOpts()...)
	err := intercept(nil, &hoptest.Stream{Ctx: context.Background()}, &grpc.StreamServerInfo{FullMethod: deliverMethod, IsClientStream: true, IsServerStream: true},
		func(any, grpc.ServerStream) error { t.Error("handler called"); return nil })
	wantCode(t, err, codes.Internal, "client-streaming")
}

// TestStreamPanicLeavesClaim: a handler (or record hook) that panics may have done its work,
// so the key stays claimed; the panic propagates and nothing deadlocks.
func TestStreamPanicLeavesClaim(t *testing.T) {
	panicky := func(_ context.Context, _ proto.Message, sent proto.Message) ([]byte, bool, bool) {
		if sent.(*handoffv1.DeliverResponse).GetResult() != nil {
			panic("record hook boom")
		}
		return nil, false, false
	}
	cases := []struct {
		name    string
		opts    []idempotency.StreamOption
		handler grpc.StreamHandler
	}{
		{"handler", deliverOpts(), func(_ any, s grpc.ServerStream) error { panic("handler boom") }},
		{"record hook", []idempotency.StreamOption{
			idempotency.WithStreamKey(deliverMethod, nil, deliverKey),
			idempotency.WithStreamReplay(deliverMethod, deliverReplay),
			idempotency.WithStreamRecord(deliverMethod, panicky),
			idempotency.WithLogger(quiet),
		}, func(_ any, s grpc.ServerStream) error {
			req := &handoffv1.DeliverRequest{}
			if err := s.RecvMsg(req); err != nil {
				return err
			}
			var f fakeRunner
			return f.Deliver(req, &grpc.GenericServerStream[handoffv1.DeliverRequest, handoffv1.DeliverResponse]{ServerStream: s})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := &faultStore{Idempotency: openBolt(t)}
			intercept := idempotency.StreamServerInterceptor(fs, c.opts...)
			ss := &hoptest.Stream{Ctx: context.Background(), In: []proto.Message{deliverReq("job-p")}}
			func() {
				defer func() {
					if recover() == nil {
						t.Error("the panic did not propagate")
					}
				}()
				intercept(nil, ss, &grpc.StreamServerInfo{FullMethod: deliverMethod, IsServerStream: true}, c.handler)
			}()
			if state, _ := lookup(t, fs, "stage:job-p:draft:1"); state != store.Pending || fs.releases.Load() != 0 {
				t.Errorf("after a panic: state %v, %d releases; want pending, none", state, fs.releases.Load())
			}
		})
	}
}

// TestStreamClaimFunc: WithStreamClaim replaces the store's Claim: its states drive the call
// as Claim's do, what it adds to the context reaches the record hook, and its error is
// Unavailable with the handler not called.
func TestStreamClaimFunc(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{}
	type mark struct{}
	var claims atomic.Int32
	var fail atomic.Bool
	var recordSaw atomic.Value
	claim := func(ctx context.Context, req proto.Message, key string, ttl time.Duration) (store.ClaimState, []byte, string, func(context.Context) context.Context, error) {
		claims.Add(1)
		if fail.Load() {
			return 0, nil, "", nil, errors.New("admission store down")
		}
		state, value, owner, err := st.Claim(ctx, key, ttl)
		job := req.(*handoffv1.DeliverRequest).GetPackage().GetJobId()
		return state, value, owner, func(c context.Context) context.Context { return context.WithValue(c, mark{}, "claimed "+job) }, err
	}
	record := func(ctx context.Context, req, sent proto.Message) ([]byte, bool, bool) {
		if v, ok := ctx.Value(mark{}).(string); ok {
			recordSaw.Store(v)
		}
		return deliverRecord(ctx, req, sent)
	}
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(s, f) },
		nil, []grpc.StreamServerInterceptor{idempotency.StreamServerInterceptor(st,
			idempotency.WithStreamKey(deliverMethod, nil, deliverKey),
			idempotency.WithStreamReplay(deliverMethod, deliverReplay),
			idempotency.WithStreamRecord(deliverMethod, record),
			idempotency.WithStreamClaim(deliverMethod, claim),
			idempotency.WithLogger(quiet))})
	c := handoffv1.NewAgentRunnerServiceClient(conn)
	ctx := context.Background()

	first, err := deliver(ctx, c, deliverReq("job-cf"))
	if err != nil || len(first) != 2 || ackStatus(first) != accepted {
		t.Fatalf("first delivery = %v, %v; want ACCEPTED and a result", first, err)
	}
	if got := recordSaw.Load(); got != "claimed job-cf" {
		t.Errorf("record hook saw %v in its context; want what the claim function added", got)
	}
	again, err := deliver(ctx, c, deliverReq("job-cf"))
	if err != nil || len(again) != 1 || ackStatus(again) != duplicate {
		t.Fatalf("re-delivery = %v, %v; want one DUPLICATE ack from the claim function's Done", again, err)
	}
	fail.Store(true)
	_, err = deliver(ctx, c, deliverReq("job-cf2"))
	wantCode(t, err, codes.Unavailable, "admission store down")
	if claims.Load() != 3 || f.calls.Load() != 1 {
		t.Errorf("claim function called %d times (want 3), handler %d (want 1)", claims.Load(), f.calls.Load())
	}
}

// gatedStore holds every Complete until gate is closed, and says when one has started.
type gatedStore struct {
	store.Idempotency
	completing chan struct{}
	gate       chan struct{}
}

func (g *gatedStore) Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error {
	g.completing <- struct{}{}
	<-g.gate
	return g.Idempotency.Complete(ctx, key, owner, value, ttl)
}

// TestRecordAfterSend: with WithStreamRecordAfterSend the result reaches the caller while
// its Complete is still held; once the Complete lands the stream ends OK and a repeat gets
// the DUPLICATE replay of that result. Without the option the result waits for the store.
func TestRecordAfterSend(t *testing.T) {
	for _, after := range []bool{true, false} {
		t.Run(map[bool]string{true: "after", false: "before"}[after], func(t *testing.T) {
			bolt := openBolt(t)
			g := &gatedStore{Idempotency: bolt, completing: make(chan struct{}, 1), gate: make(chan struct{})}
			var opts []idempotency.StreamOption
			if after {
				opts = append(opts, idempotency.WithStreamRecordAfterSend(deliverMethod))
			}
			c := runnerClient(t, g, &fakeRunner{}, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream, err := c.Deliver(ctx, deliverReq("job-as"))
			if err != nil {
				t.Fatal(err)
			}
			if m, err := stream.Recv(); err != nil || m.GetAck().GetStatus() != accepted {
				t.Fatalf("first message %v, %v; want ACCEPTED", m, err)
			}
			<-g.completing // the result is done and its Complete has started
			got := make(chan *handoffv1.DeliverResponse, 1)
			go func() {
				m, _ := stream.Recv()
				got <- m
			}()
			var res *handoffv1.StageResult
			select {
			case m := <-got:
				if !after {
					t.Fatalf("result %v arrived while its Complete was held; want it after the store write", m)
				}
				res = m.GetResult()
			case <-time.After(300 * time.Millisecond):
				if after {
					t.Fatal("no result while its Complete was held; want it sent first")
				}
			}
			if state, _ := lookup(t, bolt, "stage:job-as:draft:1"); state != store.Pending {
				t.Fatalf("key %v while Complete is held; want still claimed (Pending)", state)
			}
			close(g.gate)
			if res == nil {
				res = (<-got).GetResult()
			}
			if res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
				t.Fatalf("result %v; want COMPLETED", res)
			}
			if _, err := stream.Recv(); err != io.EOF {
				t.Fatalf("stream end %v; want OK", err)
			}
			again, err := deliver(ctx, c, deliverReq("job-as"))
			if err != nil || ackStatus(again) != duplicate || again[0].GetAck().GetPrior().GetNextHint() != res.GetNextHint() {
				t.Fatalf("repeat = %v, %v; want DUPLICATE with the first result (%q)", again, err, res.GetNextHint())
			}
		})
	}
}

// TestRecordAfterSendFailedReleasesFirst: a FAILED result still frees its key before it is
// sent, so the caller's immediate retry runs instead of being refused as in flight.
func TestRecordAfterSendFailedReleasesFirst(t *testing.T) {
	st := openBolt(t)
	f := &fakeRunner{}
	f.failFirst.Store(1)
	c := runnerClient(t, st, f, idempotency.WithStreamRecordAfterSend(deliverMethod))
	ctx := context.Background()
	stream, err := c.Deliver(ctx, deliverReq("job-af"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The FAILED result is in, the stream's end not yet read.
	if state, _ := lookup(t, st, "stage:job-af:draft:1"); state != 0 {
		t.Fatalf("key %v when the FAILED result arrived; want already released", state)
	}
	second, err := deliver(ctx, c, deliverReq("job-af"))
	if err != nil || ackStatus(second) != accepted || second[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("retry = %v, %v; want a fresh run that completes", second, err)
	}
}
