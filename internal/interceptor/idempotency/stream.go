package idempotency

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/store"
)

// StreamServerInterceptor returns a stream interceptor that runs each server-streaming
// method registered with WithStreamKey at most once per key, for "ack first" methods whose
// stream ends in one result (AgentRunnerService/Deliver).
//
// The interceptor reads the request itself (RecvMsg into newReq()), computes its key and
// claims it:
//
//   - Done: the one message WithStreamReplay builds from the request and the stored value
//     is sent and the stream ends; the handler is not called.
//   - Pending: Aborted with RetryInfo, as for unary methods; nothing is sent.
//   - Claimed: the handler runs on a wrapped stream. Its RecvMsg hands back the request once
//     (proto.Merge into the handler's message) and io.EOF after; its SendMsg passes every
//     message to the WithStreamRecord hook before sending it, which settles the key
//     (Complete on done, before the send or, with WithStreamRecordAfterSend, after it;
//     Release on failed, before the send). A handler that returns before either has its
//     key released. Its Context is detached from the caller (see the package
//     documentation), so a caller that hangs up after the ack does not stop the work: the
//     result is still recorded, and the retry gets the replay.
//
// When a done result cannot be stored, SendMsg returns Unavailable without sending it (or
// after sending it, with WithStreamRecordAfterSend), the call ends with that Unavailable
// whatever the handler returns, and the key is left claimed (see the package
// documentation).
//
// It panics on a nil store or a misconfiguration (a key without a replay or record hook, a
// method that is not server-streaming).
func StreamServerInterceptor(st store.Idempotency, opts ...StreamOption) grpc.StreamServerInterceptor {
	if st == nil {
		panic("idempotency: StreamServerInterceptor: store is nil")
	}
	cfg := newStreamConfig(opts)
	e := newEngine(st, cfg.common)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		m, ok := cfg.methods[info.FullMethod]
		if !ok {
			return handler(srv, ss)
		}
		if info.IsClientStream {
			return status.Errorf(codes.Internal, "idempotency: %s is client-streaming; only server-streaming methods can be keyed", info.FullMethod)
		}
		ctx := ss.Context()
		// The store calls and the handler run detached from the caller: one layer for
		// all of them, not one each.
		dctx := context.WithoutCancel(ctx)
		req, err := hop.ReceiveRequest(ss, m.newReq(), info.FullMethod)
		if err != nil {
			return err
		}
		key, err := computeKey(m.key, req)
		if err != nil {
			return err
		}
		var state store.ClaimState
		var value []byte
		var owner string
		var annotate func(context.Context) context.Context
		if m.claim != nil {
			state, value, owner, err = e.claimWith(dctx, info.FullMethod, key, func(cctx context.Context) (store.ClaimState, []byte, string, error) {
				var st store.ClaimState
				var v []byte
				var o string
				var err error
				st, v, o, annotate, err = m.claim(cctx, req, key, e.pendingTTL)
				return st, v, o, err
			})
		} else {
			state, value, owner, err = e.claim(dctx, info.FullMethod, key)
		}
		if err != nil {
			return err
		}
		switch state {
		case store.Done:
			out, err := m.replay(req, value)
			if err != nil {
				e.log.ErrorContext(ctx, "idempotency: replay failed", "method", info.FullMethod, "key", key, "error", err)
				if status.Code(err) != codes.Unknown { // already a gRPC status
					return err
				}
				return status.Errorf(codes.Internal, "idempotency: replaying the stored result for key %s: %v", key, err)
			}
			return ss.SendMsg(out)
		case store.Pending:
			return e.inFlight(key)
		}

		// Claimed.
		if err := ctx.Err(); err != nil {
			e.release(ctx, info.FullMethod, key, owner)
			return status.FromContextError(err).Err()
		}
		if annotate != nil {
			dctx = annotate(dctx)
		}
		wctx, cancel := e.workContext(dctx, info.FullMethod, key, owner)
		defer cancel()
		ws := &claimedStream{ReplayStream: replay(ss, info.FullMethod, req), ctx: wctx, base: dctx, e: e, m: m, method: info.FullMethod, key: key, owner: owner, req: req}
		returned := false
		defer func() {
			if !returned {
				ws.mu.Lock()
				settled := ws.outcome != open
				ws.mu.Unlock()
				if !settled {
					e.log.ErrorContext(ctx, "idempotency: handler panicked; its key stays claimed until the pending TTL lapses",
						"method", info.FullMethod, "key", key, "pending_ttl", e.pendingTTL)
				}
			}
		}()
		herr := handler(srv, ws)
		returned = true

		ws.mu.Lock()
		defer ws.mu.Unlock()
		switch ws.outcome {
		case open:
			ws.outcome = released
			e.release(ctx, info.FullMethod, key, owner)
		case unrecorded:
			return ws.recordErr
		}
		return herr
	}
}

// outcome is how a claimed key was settled.
type outcome int

const (
	open       outcome = iota // not yet
	completed                 // result stored
	released                  // failed: key freed
	unrecorded                // done, but the result could not be stored: claim left
)

// claimedStream is the stream the handler of a claimed key sees.
type claimedStream struct {
	*hop.ReplayStream
	ctx    context.Context
	base   context.Context // ctx's values without its cancel or deadline: what Complete runs under
	e      *engine
	m      *streamMethod
	method string
	key    string
	owner  string // the claim's owner token
	req    proto.Message

	mu        sync.Mutex // guards ReplayStream's RecvMsg and the outcome
	outcome   outcome
	recordErr error
}

func (s *claimedStream) Context() context.Context { return s.ctx }

// replay is the ReplayStream that hands the request the interceptor read to the handler
// once, then io.EOF. A RecvMsg into another type is Internal and leaves the request for the
// next one.
func replay(ss grpc.ServerStream, method string, req proto.Message) *hop.ReplayStream {
	return &hop.ReplayStream{
		ServerStream: ss,
		First:        req,
		Refuse: func(m any) error {
			return status.Errorf(codes.Internal, "idempotency: %s: the handler reads %T, the request is %s",
				method, m, req.ProtoReflect().Descriptor().FullName())
		},
		KeepOnRefuse: true,
	}
}

// RecvMsg hands the request the interceptor read to the handler once, then io.EOF.
func (s *claimedStream) RecvMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ReplayStream.RecvMsg(m)
}

// SendMsg passes m to the record hook and settles the key as it says: a done result is
// stored (Complete) before m is sent, or just after it with WithStreamRecordAfterSend; a
// failed one releases the key before m is sent, so an immediate retry can claim it. An
// error from storing a done result means, before the send, that m was not sent.
//
// mu is held through the send: a stream's SendMsg is not safe for concurrent use anyway,
// and the outcome must not change between the verdict and the store write.
func (s *claimedStream) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.outcome == unrecorded {
		return s.recordErr
	}
	msg, ok := m.(proto.Message)
	if !ok {
		return s.ServerStream.SendMsg(m)
	}
	value, done, failed := s.m.record(s.ctx, s.req, msg)
	switch {
	case s.outcome != open:
		if done || failed {
			s.e.log.WarnContext(s.ctx, "idempotency: the key is already settled; later result ignored",
				"method", s.method, "key", s.key, "done", done, "failed", failed)
		}
	case done && s.m.afterSend:
		// The caller keeps the result itself before acting on it, so the store write
		// need not delay it. It is made even if the send failed: the work is done, and
		// the caller's retry should get it back rather than run it again.
		// On bbolt the write may wait a moment to share the caller's next write's fsync
		// (the coordinator saves the result it just got).
		sendErr := s.ServerStream.SendMsg(m)
		if err := s.complete(store.Linger(s.base, afterSendLinger), value); err != nil {
			return err
		}
		return sendErr
	case done:
		if err := s.complete(s.base, value); err != nil {
			return err
		}
	case failed:
		s.e.release(s.base, s.method, s.key, s.owner)
		s.outcome = released
	}
	return s.ServerStream.SendMsg(m)
}

// afterSendLinger is how long a completion stored after its result was sent may wait for
// company on bbolt (store.Linger): it is off the caller's path, and the caller's save of the
// result comes right behind it.
const afterSendLinger = time.Millisecond

// complete stores a done result under the key; on failure the key stays claimed and the
// call ends with the error.
func (s *claimedStream) complete(ctx context.Context, value []byte) error {
	if err := s.e.complete(ctx, s.key, s.owner, value); err != nil {
		s.outcome = unrecorded
		s.recordErr = s.e.notRecorded(s.ctx, s.method, s.key, err)
		return s.recordErr
	}
	s.outcome = completed
	return nil
}
