package rpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/testkit"
)

// holdRunner's Deliver stays in its handler until release is closed, counting how many
// are in at once.
type holdRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	release     chan struct{}
	in, maxSeen atomic.Int64
}

func (r *holdRunner) Deliver(_ *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	n := r.in.Add(1)
	defer r.in.Add(-1)
	for {
		m := r.maxSeen.Load()
		if n <= m || r.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-r.release:
	case <-s.Context().Done():
	}
	return nil
}

// serveTCP serves r (and health) with limits on 127.0.0.1, assembled as a service's
// server is (internal/server, whose chain and options are rpc.NewServer's), and returns the
// address.
func serveTCP(t *testing.T, r handoffv1.AgentRunnerServiceServer, l rpc.Limits) string {
	t.Helper()
	srv, err := server.New(server.Service{Name: "limits", Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, r) }},
		server.WithoutIdentity(), server.WithLogger(slog.New(slog.DiscardHandler)), server.WithLimits(l))
	if err != nil {
		t.Fatal(err)
	}
	return testkit.ServeTCP(t, srv)
}

// hold starts a Deliver on cc that stays open until the runner releases it; the returned
// channel gets the call's end.
func hold(ctx context.Context, cc *grpc.ClientConn) <-chan error {
	done := make(chan error, 1)
	go func() {
		s, err := handoffv1.NewAgentRunnerServiceClient(cc).Deliver(ctx, &handoffv1.DeliverRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		done <- err
	}()
	return done
}

// admit starts a held call on cc and waits until it is in r's handler, with want calls
// there. An ended call's slot comes back when the server sees its stream's context end,
// a moment after the caller has the call's end, so a call refused in that moment is
// retried; a slot that never comes back still fails the test after 10 s.
func admit(t *testing.T, ctx context.Context, cc *grpc.ClientConn, r *holdRunner, want int64) <-chan error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := hold(ctx, cc)
	wait:
		for r.in.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10s for call %d in the handler; %d there", want, r.in.Load())
			}
			select {
			case err := <-done:
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("call %d ended before the handler: %v", want, err)
				}
				break wait
			case <-time.After(5 * time.Millisecond):
			}
		}
		if r.in.Load() >= want {
			return done
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	testkit.Eventually(t, 10*time.Second, what, cond)
}

// TestStreamsCappedPerConnection: a client opening more streams than MaxStreamsPerConn on
// one connection has only that many in the server at once; the rest wait their turn and
// all finish.
func TestStreamsCappedPerConnection(t *testing.T) {
	r := &holdRunner{release: make(chan struct{})}
	cc := testkit.Dial(t, serveTCP(t, r, rpc.Limits{MaxStreamsPerConn: 2}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var calls []<-chan error
	for range 6 {
		calls = append(calls, hold(ctx, cc))
	}
	waitFor(t, "two calls in the handler", func() bool { return r.in.Load() >= 2 })
	time.Sleep(300 * time.Millisecond) // room for a third, if the cap let one through
	if n := r.in.Load(); n != 2 {
		t.Fatalf("%d calls in the handler at once, want the cap of 2", n)
	}
	close(r.release)
	for i, c := range calls {
		if err := <-c; err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if m := r.maxSeen.Load(); m != 2 {
		t.Fatalf("at most %d calls at once, want 2", m)
	}
}

// TestStreamsCappedServerWide: past MaxStreams calls in flight over all connections, a new
// call is refused with ResourceExhausted (health checks still answer), and slots come back
// however calls end, also calls to methods the server does not have.
func TestStreamsCappedServerWide(t *testing.T) {
	r := &holdRunner{release: make(chan struct{})}
	addr := serveTCP(t, r, rpc.Limits{MaxStreams: 3})
	a, b := testkit.Dial(t, addr), testkit.Dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	first, quit := context.WithCancel(ctx)
	fill := func() []<-chan error {
		return []<-chan error{admit(t, first, a, r, 1), admit(t, ctx, a, r, 2), admit(t, ctx, b, r, 3)}
	}
	over := func() {
		t.Helper()
		err := <-hold(ctx, b)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "limit of 3 calls") {
			t.Fatalf("fourth call: %v, want ResourceExhausted naming the limit", err)
		}
		hc, err := healthpb.NewHealthClient(b).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check on a full server: %v, %v", hc, err)
		}
	}

	calls := fill()
	over()
	// One caller gives up (its stream is reset): its slot comes back.
	quit()
	if err := <-calls[0]; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	waitFor(t, "a free slot", func() bool { return r.in.Load() == 2 })
	more := admit(t, ctx, b, r, 3)
	close(r.release)
	for _, c := range append(calls[1:], more) {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}

	// Calls to a method the server does not have give their slot back too. As in admit, the
	// slots of the calls just ended (and of each unknown-method call) come back a moment
	// after the caller has the call's end, so a call refused in that moment is retried; slots
	// that never come back still fail the test after 10 s.
	for range 10 {
		var err error
		waitFor(t, "a slot for an unknown method's call", func() bool {
			err = a.Invoke(ctx, "/handoff.v1.Nope/Nope", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
			return status.Code(err) != codes.ResourceExhausted
		})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("unknown method: %v", err)
		}
	}
	r.release = make(chan struct{})
	first = ctx
	calls = fill()
	over()
	close(r.release)
	for _, c := range calls {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
}

// h2 is a raw HTTP/2 client connection, for what a grpc-go client will not do (ping too
// often, ignore pings).
type h2 struct {
	conn   net.Conn
	mu     sync.Mutex // guards writes on fr
	fr     *http2.Framer
	frames chan http2.Frame // copies of what the server sent; closed when the read fails
}

func dialH2(t *testing.T, addr string, ackPings bool) *h2 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	h := &h2{conn: c, fr: http2.NewFramer(c, c), frames: make(chan http2.Frame, 64)}
	if err := h.write(func(fr *http2.Framer) error { return fr.WriteSettings() }); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.frames)
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					h.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
				}
			case *http2.PingFrame:
				if !f.IsAck() && ackPings {
					h.write(func(fr *http2.Framer) error { return fr.WritePing(true, f.Data) })
				}
				h.frames <- &http2.PingFrame{FrameHeader: f.FrameHeader, Data: f.Data}
			case *http2.GoAwayFrame:
				// DebugData is valid only until the next ReadFrame: copy it now.
				h.frames <- goaway{code: f.ErrCode, debug: string(f.DebugData())}
			}
		}
	}()
	return h
}

// goaway is a GOAWAY's code and debug data, copied while they are valid.
type goaway struct {
	http2.Frame
	code  http2.ErrCode
	debug string
}

func (h *h2) write(w func(*http2.Framer) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return w(h.fr)
}

// TestPingFloodGetsGoaway: a client pinging more often than MinPingInterval is sent GOAWAY
// ENHANCE_YOUR_CALM "too_many_pings" and its connection closed.
func TestPingFloodGetsGoaway(t *testing.T) {
	h := dialH2(t, serveTCP(t, &holdRunner{}, rpc.Limits{}), true)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var data [8]byte
			data[0] = byte(i)
			if h.write(func(fr *http2.Framer) error { return fr.WritePing(false, data) }) != nil {
				return
			}
		}
	}()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-h.frames:
			if !ok {
				t.Fatal("connection closed without GOAWAY")
			}
			if g, ok := f.(goaway); ok {
				if g.code != http2.ErrCodeEnhanceYourCalm || g.debug != "too_many_pings" {
					t.Fatalf("GOAWAY %s %q, want ENHANCE_YOUR_CALM too_many_pings", g.code, g.debug)
				}
				return
			}
		case <-timeout:
			t.Fatal("no GOAWAY after 10s of pings every 20ms")
		}
	}
}

// TestKeepaliveClosesSilentConnection: the server pings a connection that has been silent
// for KeepaliveTime and closes it when the ping is not answered within KeepaliveTimeout,
// so a dead client does not hold its streams (grpc-go's own default waits 2 hours).
func TestKeepaliveClosesSilentConnection(t *testing.T) {
	h := dialH2(t, serveTCP(t, &holdRunner{}, rpc.Limits{KeepaliveTime: time.Second, KeepaliveTimeout: 500 * time.Millisecond}), false)
	start := time.Now()
	timeout := time.After(10 * time.Second)
	var pinged time.Duration
	for {
		select {
		case f, ok := <-h.frames:
			if !ok {
				if pinged == 0 {
					t.Fatal("connection closed before the server pinged")
				}
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() && pinged == 0 {
				pinged = time.Since(start)
			}
		case <-timeout:
			t.Fatalf("connection still open after 10s (server pinged after %s)", pinged)
		}
	}
}

// silentCall opens a unary call to Check and never sends its request, as the attack that
// filled a server did; it returns the call's end.
func silentCall(ctx context.Context, cc *grpc.ClientConn) <-chan error {
	done := make(chan error, 1)
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, handoffv1.AgentRunnerService_Check_FullMethodName)
	if err != nil {
		done <- err
		return done
	}
	go func() { done <- s.RecvMsg(&handoffv1.CheckResponse{}) }()
	return done
}

type checkRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
}

func (checkRunner) Check(context.Context, *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	return &handoffv1.CheckResponse{}, nil
}

// Callers without a service identity have their own pool: filling it leaves the services'
// calls room, and a call that never sends its request is cancelled after RequestTimeout,
// giving its slot back.
func TestAnonymousCallsCannotFillTheServer(t *testing.T) {
	g := rpc.NewServer(rpc.ServerConfig{Service: "limits", Logger: slog.New(slog.DiscardHandler),
		Limits: rpc.Limits{MaxStreams: 8, MaxAnonymousStreams: 2, RequestTimeout: 500 * time.Millisecond},
		Identified: func(ctx context.Context) bool {
			md, _ := metadata.FromIncomingContext(ctx)
			return len(md.Get("x-test-service")) > 0
		}})
	handoffv1.RegisterAgentRunnerServiceServer(g, checkRunner{})
	cc := testkit.Dial(t, testkit.ServeTCP(t, g))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held := []<-chan error{silentCall(ctx, cc), silentCall(ctx, cc)}
	client := handoffv1.NewAgentRunnerServiceClient(cc)
	var err3 error
	waitFor(t, "the anonymous pool to be full", func() bool {
		_, err3 = client.Check(ctx, &handoffv1.CheckRequest{})
		return status.Code(err3) == codes.ResourceExhausted
	})
	if !strings.Contains(err3.Error(), "without a service identity") {
		t.Fatalf("third anonymous call: %v; want the anonymous pool named", err3)
	}
	service := metadata.AppendToOutgoingContext(ctx, "x-test-service", "coordinator")
	if _, err := client.Check(service, &handoffv1.CheckRequest{}); err != nil {
		t.Fatalf("a service's call while the anonymous pool is full: %v", err)
	}
	for i, h := range held {
		select {
		case err := <-h:
			if status.Code(err) != codes.Canceled && status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("silent call %d ended with %v; want it cancelled", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("silent call %d still open 10 s after its request timeout", i)
		}
	}
	waitFor(t, "the anonymous pool's slots back", func() bool {
		_, err := client.Check(ctx, &handoffv1.CheckRequest{})
		return err == nil
	})
}

// A call whose request arrives in time is not cut by the request timeout, however long it
// then runs.
func TestRequestTimeoutSparesCallsThatSent(t *testing.T) {
	r := &holdRunner{release: make(chan struct{})}
	cc := testkit.Dial(t, serveTCP(t, r, rpc.Limits{RequestTimeout: 200 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := hold(ctx, cc)
	waitFor(t, "the call in its handler", func() bool { return r.in.Load() == 1 })
	time.Sleep(600 * time.Millisecond)
	close(r.release)
	if err := <-call; err != nil {
		t.Fatalf("a call that sent its request, held past the request timeout: %v", err)
	}
}
