package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestStreamChainConcurrentFirstCalls: the first calls of a server arrive together, some of a
// registered method, some of names no service registered (each its own). Every one runs
// every interceptor once, in order, then its own handler; the kept table ends with the one
// registered method and none of the callers' names (run with -race: the table and the
// registered set are read and filled by all of them at once).
func TestStreamChainConcurrentFirstCalls(t *testing.T) {
	var order atomic.Int64 // calls whose interceptors ran out of order
	var ran atomic.Int64   // handlers reached
	in := func(i int) grpc.StreamServerInterceptor {
		return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			seen := ss.Context().Value(stepKey{}).(*atomic.Int64)
			if seen.Add(1) != int64(i+1) {
				order.Add(1)
			}
			return handler(srv, ss)
		}
	}
	const n = 4
	ints := []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, stepStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), stepKey{}, new(atomic.Int64))})
	}}
	for i := range n {
		ints = append(ints, in(i))
	}
	last := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if got := ss.Context().Value(stepKey{}).(*atomic.Int64).Load(); got != n {
			order.Add(1)
		}
		ran.Add(1)
		return handler(srv, ss)
	}
	c := newStreamChain(append(ints, last))
	g := grpc.NewServer(grpc.StreamInterceptor(c.intercept), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return nil }))
	c.server.Store(g)
	handoffv1.RegisterAgentRunnerServiceServer(g, chainRunner{log: func(string) {}})
	cc := testkit.Dial(t, testkit.ServeTCP(t, g))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const calls = 64
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			method := handoffv1.AgentRunnerService_Deliver_FullMethodName
			if i%2 == 1 {
				method = fmt.Sprintf("/attacker.Service%d/Stream", i)
			}
			s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
			if err == nil {
				err = s.SendMsg(&handoffv1.DeliverRequest{})
			}
			if err == nil {
				s.CloseSend()
				if err = s.RecvMsg(&handoffv1.DeliverResponse{}); errors.Is(err, io.EOF) {
					err = nil
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ran.Load() != calls || order.Load() != 0 {
		t.Fatalf("%d of %d calls reached their handler, %d out of order", ran.Load(), calls, order.Load())
	}
	var kept []string
	c.chains.Range(func(k, _ any) bool { kept = append(kept, k.(string)); return true })
	if !slices.Equal(kept, []string{handoffv1.AgentRunnerService_Deliver_FullMethodName}) {
		t.Fatalf("kept chains %v; want only the registered method", kept)
	}
}

type stepKey struct{}

type stepStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s stepStream) Context() context.Context { return s.ctx }
