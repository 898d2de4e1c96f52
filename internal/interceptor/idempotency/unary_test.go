package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestUnary calls the interceptor directly with a fake handler that counts its calls.
func TestUnary(t *testing.T) {
	const key = "job-1:writeback:summary_md"
	stored := &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{IdempotencyKey: key, ExternalId: "ext-first"}}
	handlerErr := status.Error(codes.Unavailable, "target ledger: connection refused")

	type tc struct {
		name   string
		method string               // default writeMethod
		req    any                  // default writeReq("job-1")
		opts   []idempotency.Option // default writeOpts()
		fault  func(*faultStore)
		seed   func(t *testing.T, st store.Idempotency) // records present before the call
		ctx    func() context.Context
		fail   error // the handler's error
		code   codes.Code
		msg    string // exact message, when set
		calls  int32
		check  func(t *testing.T, resp any, err error, fs *faultStore)
	}
	cases := []tc{
		{
			name: "unkeyed method passes through", method: checkMethod, calls: 1,
			check: func(t *testing.T, _ any, _ error, fs *faultStore) {
				if fs.claims.Load() != 0 {
					t.Errorf("store claimed %d times for an unkeyed method", fs.claims.Load())
				}
			},
		},
		{
			name: "key error is InvalidArgument", req: &handoffv1.WriteRequest{Target: "ledger"},
			code: codes.InvalidArgument, msg: "idempotency key: job_id, stage and artifact.type are required",
			check: func(t *testing.T, _ any, _ error, fs *faultStore) {
				if fs.claims.Load() != 0 {
					t.Error("claimed despite the key error")
				}
			},
		},
		{
			name: "key status error keeps its message",
			opts: []idempotency.Option{idempotency.WithKey(writeMethod, nil, func(proto.Message) (string, error) {
				return "", status.Error(codes.FailedPrecondition, "no key here")
			})},
			code: codes.InvalidArgument, msg: "idempotency key: no key here",
		},
		{
			name: "empty key is InvalidArgument",
			opts: []idempotency.Option{idempotency.WithKey(writeMethod, nil, func(proto.Message) (string, error) { return "", nil })},
			code: codes.InvalidArgument, msg: "idempotency key: empty",
		},
		{
			name: "claimed runs the handler and stores its answer", calls: 1,
			check: func(t *testing.T, resp any, _ error, fs *faultStore) {
				if resp.(*handoffv1.WriteResponse).GetDuplicate() {
					t.Error("first answer marked duplicate")
				}
				state, value := lookup(t, fs, key)
				got := &handoffv1.WriteResponse{}
				if state != store.Done || proto.Unmarshal(value, got) != nil || !proto.Equal(got, resp.(proto.Message)) {
					t.Errorf("stored %v %x; want the answer %v", state, value, resp)
				}
			},
		},
		{
			name: "done replays without the handler",
			seed: func(t *testing.T, st store.Idempotency) { seedDone(t, st, key, stored) },
			check: func(t *testing.T, resp any, _ error, fs *faultStore) {
				got := resp.(*handoffv1.WriteResponse)
				if !got.GetDuplicate() || got.GetReceipt().GetExternalId() != "ext-first" {
					t.Errorf("replay = %v; want the stored receipt with duplicate=true", got)
				}
				if fs.completes.Load() != 0 || fs.releases.Load() != 0 {
					t.Error("a replay completed or released the key")
				}
			},
		},
		{
			name: "done without a replay hook returns the stored answer as is",
			opts: []idempotency.Option{idempotency.WithKey(writeMethod, nil, writeKey)},
			seed: func(t *testing.T, st store.Idempotency) { seedDone(t, st, key, stored) },
			check: func(t *testing.T, resp any, _ error, _ *faultStore) {
				testkit.Equal(t, resp, stored, "the replay")
			},
		},
		{
			name: "pending is Aborted with RetryInfo",
			seed: func(t *testing.T, st store.Idempotency) { seedPending(t, st, key) },
			code: codes.Aborted, msg: "request with idempotency key " + key + " is in flight; retry in 1s",
			check: func(t *testing.T, _ any, err error, _ *faultStore) {
				if d, ok := retryDelay(err); !ok || d != time.Second {
					t.Errorf("RetryInfo = %v, %v; want 1s", d, ok)
				}
			},
		},
		{
			name: "pending honours WithRetryDelay",
			opts: writeOpts(idempotency.WithRetryDelay(250 * time.Millisecond)),
			seed: func(t *testing.T, st store.Idempotency) { seedPending(t, st, key) },
			code: codes.Aborted, msg: "request with idempotency key " + key + " is in flight; retry in 250ms",
			check: func(t *testing.T, _ any, err error, _ *faultStore) {
				if d, ok := retryDelay(err); !ok || d != 250*time.Millisecond {
					t.Errorf("RetryInfo = %v, %v; want 250ms", d, ok)
				}
			},
		},
		{
			name: "handler error releases and is returned unchanged", fail: handlerErr, calls: 1,
			code: codes.Unavailable, msg: "target ledger: connection refused",
			check: func(t *testing.T, _ any, err error, fs *faultStore) {
				if err != handlerErr {
					t.Errorf("error = %#v; want the handler's own error", err)
				}
				if state, _ := lookup(t, fs, key); state != 0 || fs.releases.Load() != 1 {
					t.Errorf("after a handler error: state %v, %d releases; want no record, 1 release", state, fs.releases.Load())
				}
			},
		},
		{
			name: "failed release still returns the handler error", fail: handlerErr, calls: 1,
			fault: func(fs *faultStore) { fs.releaseErr = errors.New("store down") },
			code:  codes.Unavailable,
			check: func(t *testing.T, _ any, _ error, fs *faultStore) {
				if state, _ := lookup(t, fs, key); state != store.Pending {
					t.Errorf("state %v; want the claim left pending until its TTL", state)
				}
			},
		},
		{
			name:  "claim failure fails closed",
			fault: func(fs *faultStore) { fs.claimErr = errors.New("dial tcp 127.0.0.1:6379: connection refused") },
			code:  codes.Unavailable, msg: "idempotency store: claim " + key + ": dial tcp 127.0.0.1:6379: connection refused",
		},
		{
			name:  "complete failure is Unavailable (come back) and leaves the claim",
			fault: func(fs *faultStore) { fs.completeErr = errors.New("disk full") },
			calls: 1, code: codes.Unavailable,
			check: func(t *testing.T, _ any, err error, fs *faultStore) {
				msg := status.Convert(err).Message()
				if !strings.Contains(msg, key) || !strings.Contains(msg, "disk full") {
					t.Errorf("message %q; want the key and the cause", msg)
				}
				if fs.completes.Load() != 3 || fs.releases.Load() != 0 {
					t.Errorf("%d completes, %d releases; want 3 attempts and no release", fs.completes.Load(), fs.releases.Load())
				}
				if state, _ := lookup(t, fs, key); state != store.Pending {
					t.Errorf("state %v; want pending", state)
				}
			},
		},
		{
			name: "unreadable stored answer is Internal",
			seed: func(t *testing.T, st store.Idempotency) {
				owner := seedPending(t, st, key)
				if err := st.Complete(context.Background(), key, owner, []byte{0xff, 0xff}, 0); err != nil {
					t.Fatal(err)
				}
			},
			code: codes.Internal, msg: "idempotency: stored result for key " + key + " is unreadable",
		},
		{
			name: "caller gone before the work frees the key",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			code: codes.Canceled,
			check: func(t *testing.T, _ any, _ error, fs *faultStore) {
				if state, _ := lookup(t, fs, key); state != 0 || fs.releases.Load() != 1 {
					t.Errorf("state %v, %d releases; want the claim released", state, fs.releases.Load())
				}
			},
		},
		{
			name: "non-proto request is Internal", req: "not a message", code: codes.Internal,
		},
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
			opts := c.opts
			if opts == nil {
				opts = writeOpts()
			}
			if c.method == "" {
				c.method = writeMethod
			}
			if c.req == nil {
				c.req = writeReq("job-1")
			}
			ctx := context.Background()
			if c.ctx != nil {
				ctx = c.ctx()
			}
			var calls int32
			handler := func(ctx context.Context, req any) (any, error) {
				calls++
				if c.fail != nil {
					return nil, c.fail
				}
				return &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{IdempotencyKey: key, ExternalId: "ext-new"}}, nil
			}
			intercept := idempotency.UnaryServerInterceptor(fs, append(opts, idempotency.WithLogger(quiet))...)
			resp, err := intercept(ctx, c.req, &grpc.UnaryServerInfo{FullMethod: c.method}, handler)
			if status.Code(err) != c.code {
				t.Fatalf("error = %v; want code %s", err, c.code)
			}
			if c.msg != "" && !strings.HasPrefix(status.Convert(err).Message(), c.msg) {
				t.Errorf("message = %q; want it to start %q", status.Convert(err).Message(), c.msg)
			}
			if calls != c.calls {
				t.Errorf("handler called %d times; want %d", calls, c.calls)
			}
			if c.check != nil {
				c.check(t, resp, err, fs)
			}
		})
	}
}

// seedPending claims key and returns the claim's owner token.
func seedPending(t *testing.T, st store.Idempotency, key string) string {
	t.Helper()
	state, _, owner, err := st.Claim(context.Background(), key, time.Minute)
	if err != nil || state != store.Claimed {
		t.Fatalf("seed claim: %v %v", state, err)
	}
	return owner
}

func seedDone(t *testing.T, st store.Idempotency, key string, m proto.Message) {
	t.Helper()
	owner := seedPending(t, st, key)
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(context.Background(), key, owner, b, 0); err != nil {
		t.Fatal(err)
	}
}

type ctxKey struct{}

// TestUnaryHandlerContext: once claimed, the handler keeps the caller's values but not its
// cancellation or deadline, and runs under a deadline of pendingTTL/2.
func TestUnaryHandlerContext(t *testing.T) {
	st := openBolt(t)
	const ttl = 40 * time.Second
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "kept"), time.Hour)
	defer cancel()
	intercept := idempotency.UnaryServerInterceptor(st, writeOpts(idempotency.WithPendingTTL(ttl))...)
	start := time.Now()
	_, err := intercept(ctx, writeReq("job-ctx"), &grpc.UnaryServerInfo{FullMethod: writeMethod},
		func(hctx context.Context, _ any) (any, error) {
			cancel() // the caller hangs up mid-write
			if hctx.Err() != nil {
				t.Errorf("handler context cancelled with the caller: %v", hctx.Err())
			}
			if hctx.Value(ctxKey{}) != "kept" {
				t.Error("handler context lost the caller's values")
			}
			dl, ok := hctx.Deadline()
			if want := start.Add(ttl / 2); !ok || dl.Before(want.Add(-time.Second)) || dl.After(want.Add(time.Second)) {
				t.Errorf("handler deadline %v (set %v); want about %v", dl, ok, want)
			}
			return &handoffv1.WriteResponse{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUnaryPanicLeavesClaim: a panicking handler may have written, so its key stays claimed.
func TestUnaryPanicLeavesClaim(t *testing.T) {
	fs := &faultStore{Idempotency: openBolt(t)}
	intercept := idempotency.UnaryServerInterceptor(fs, writeOpts()...)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not propagate")
			}
		}()
		intercept(context.Background(), writeReq("job-panic"), &grpc.UnaryServerInfo{FullMethod: writeMethod},
			func(context.Context, any) (any, error) { panic("boom") })
	}()
	if state, _ := lookup(t, fs, "job-panic:writeback:summary_md"); state != store.Pending || fs.releases.Load() != 0 {
		t.Errorf("after a panic: state %v, %d releases; want pending, none", state, fs.releases.Load())
	}
}

// TestResponseTypeFromRegistry: WithKey with a nil newResp replays the registered type.
func TestResponseTypeFromRegistry(t *testing.T) {
	st := openBolt(t)
	intercept := idempotency.UnaryServerInterceptor(st,
		idempotency.WithKey(writeMethod, nil, writeKey), idempotency.WithReplay(writeMethod, markDuplicate), idempotency.WithLogger(quiet))
	info := &grpc.UnaryServerInfo{FullMethod: writeMethod}
	first := &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{ExternalId: "ext-1"}}
	h := func(context.Context, any) (any, error) { return first, nil }
	if _, err := intercept(context.Background(), writeReq("job-reg"), info, h); err != nil {
		t.Fatal(err)
	}
	resp, err := intercept(context.Background(), writeReq("job-reg"), info, h)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := resp.(*handoffv1.WriteResponse)
	if !ok || !got.GetDuplicate() || got.GetReceipt().GetExternalId() != "ext-1" {
		t.Errorf("replay = %T %v; want *WriteResponse ext-1 duplicate", resp, resp)
	}
}

// TestOptionPanics: misconfigurations fail when the interceptor is built, not per call.
func TestOptionPanics(t *testing.T) {
	st := openBolt(t)
	newWR := func() proto.Message { return &handoffv1.WriteResponse{} }
	unary := func(opts ...idempotency.Option) func() {
		return func() { idempotency.UnaryServerInterceptor(st, opts...) }
	}
	stream := func(opts ...idempotency.StreamOption) func() {
		return func() { idempotency.StreamServerInterceptor(st, opts...) }
	}
	cases := []struct {
		name  string
		build func()
		want  string
	}{
		{"nil store", func() { idempotency.UnaryServerInterceptor(nil) }, "store is nil"},
		{"nil stream store", func() { idempotency.StreamServerInterceptor(nil) }, "store is nil"},
		{"nil key func", unary(idempotency.WithKey(writeMethod, newWR, nil)), "key function is nil"},
		{"key twice", unary(idempotency.WithKey(writeMethod, newWR, writeKey), idempotency.WithKey(writeMethod, newWR, writeKey)), "given twice"},
		{"replay without key", unary(idempotency.WithReplay(writeMethod, markDuplicate)), "without WithKey"},
		{"wrong response type", unary(idempotency.WithKey(writeMethod, func() proto.Message { return &handoffv1.CheckResponse{} }, writeKey)), "the method's message is handoff.v1.WriteResponse"},
		{"malformed method", unary(idempotency.WithKey("handoff.v1.WritebackService.Write", newWR, writeKey)), "want a full method name"},
		{"unregistered method without newResp", unary(idempotency.WithKey("/x.v1.Nope/Do", nil, writeKey)), "not in the protobuf registry"},
		{"streaming method as unary", unary(idempotency.WithKey(deliverMethod, nil, deliverKey)), "use StreamServerInterceptor"},
		{"zero pending TTL", unary(idempotency.WithPendingTTL(0)), "must be positive"},
		{"negative result TTL", unary(idempotency.WithResultTTL(-time.Second)), "must not be negative"},
		{"negative retry delay", stream(idempotency.WithRetryDelay(-time.Second)), "must not be negative"},
		{"negative claim renewal", stream(idempotency.WithClaimRenewal(-time.Second)), "WithClaimRenewal(-1s): must not be negative"},
		{"unary method as stream", stream(idempotency.WithStreamKey(writeMethod, nil, writeKey)), "only server-streaming"},
		{"stream key without replay", stream(idempotency.WithStreamKey(deliverMethod, nil, deliverKey), idempotency.WithStreamRecord(deliverMethod, deliverRecord)), "needs WithStreamReplay"},
		{"stream key without record", stream(idempotency.WithStreamKey(deliverMethod, nil, deliverKey), idempotency.WithStreamReplay(deliverMethod, deliverReplay)), "needs WithStreamRecord"},
		{"stream record without key", stream(idempotency.WithStreamRecord(deliverMethod, deliverRecord), idempotency.WithStreamReplay(deliverMethod, deliverReplay)), "without WithStreamKey"},
		{"wrong request type", stream(idempotency.WithStreamKey(deliverMethod, func() proto.Message { return &handoffv1.CheckRequest{} }, deliverKey)), "the method's message is handoff.v1.DeliverRequest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("no panic")
				}
				if s, _ := r.(string); !strings.Contains(s, c.want) {
					t.Fatalf("panic %v; want it to mention %q", r, c.want)
				}
			}()
			c.build()
		})
	}
	// The shared options are both Options and StreamOptions.
	idempotency.UnaryServerInterceptor(st, idempotency.WithPendingTTL(time.Minute), idempotency.WithResultTTL(time.Hour), idempotency.WithRetryDelay(0))
	idempotency.StreamServerInterceptor(st, deliverOpts(idempotency.WithPendingTTL(time.Minute), idempotency.WithResultTTL(time.Hour))...)
}
