package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/rpc"
)

// The hop proxy stands between the coordinators and the agent runner and writeback, as the
// network does: both coordinators dial it for --agentrunner and --writeback, and it forwards
// every call, as the coordinator (a service token signed with the deployment's key), to the
// real service. It is where the harness
//
//   - counts hops: calls, and distinct hops (job, stage, judge round), the clock of the
//     fault plan, which retries do not advance,
//   - re-delivers a share of hops (decided at a hop's first call, not at its retries): the
//     same DeliverRequest or WriteRequest is sent a second time, concurrently with the first (a duplicated request on the network), and the
//     duplicate's answer is recorded and dropped: the runner's completion key or the
//     writeback's idempotency key must make it harmless,
//   - kills the agent runner mid-stage: right after it answered ACCEPTED to a package and
//     before the stage result reached the coordinator.
type proxy struct {
	h *harness
	// passAuth: the proxy passes each call's authorization (the coordinator's service
	// token) on, as the network does, instead of calling with a token of its own; on bbolt,
	// where `handoff up` keeps its services' keys to itself.
	passAuth bool
	runner   handoffv1.AgentRunnerServiceClient
	wb       handoffv1.WritebackServiceClient
	srv      *grpc.Server
	addr     string

	wg sync.WaitGroup // re-deliveries in flight

	mu    sync.Mutex
	redel RedeliveryReport
}

// RedeliveryReport says what the re-delivered copies of hops were answered.
type RedeliveryReport struct {
	// Sent is how many hops were delivered a second time.
	Sent int `json:"sent"`
	// Duplicate: answered DUPLICATE (stage) or with the first receipt (write): absorbed.
	Duplicate int `json:"answered_duplicate"`
	// InFlight: answered Aborted while the first copy was still running: absorbed.
	InFlight int `json:"answered_in_flight"`
	// Ran: the copy won the race and did the stage or write itself; the coordinator's own
	// copy was then answered DUPLICATE or in flight instead.
	Ran int `json:"ran_the_hop"`
	// Other: refused for another reason (the service down, an empty wallet after the hop),
	// counted by reason in OtherReasons.
	Other        int            `json:"other"`
	OtherReasons map[string]int `json:"other_reasons,omitempty"`
}

func (r *RedeliveryReport) other(reason string) {
	r.Other++
	if r.OtherReasons == nil {
		r.OtherReasons = map[string]int{}
	}
	r.OtherReasons[reason]++
}

// reason names an error by its code and the start of its message.
func reason(err error) string {
	st := status.Convert(err)
	return st.Code().String() + ": " + clip(st.Message(), 60)
}

// forward copies the caller's trace context (gRPC metadata) to the upstream call, so the
// proxy is invisible in traces, as the network is; with passAuth its authorization too.
func (p *proxy) forward(ctx context.Context) context.Context {
	return p.forwardTo(ctx, ctx)
}

// forwardTo is forward onto another context than the caller's own (a re-delivered copy's,
// which outlives the call).
func (p *proxy) forwardTo(out, ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	keys := []string{"traceparent", "tracestate"}
	if p.passAuth {
		keys = append(keys, "authorization")
	}
	var kv []string
	for _, k := range keys {
		for _, v := range md.Get(k) {
			kv = append(kv, k, v)
		}
	}
	return metadata.AppendToOutgoingContext(out, kv...)
}

func (p *proxy) start() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	p.addr = l.Addr().String()
	p.srv = grpc.NewServer()
	handoffv1.RegisterAgentRunnerServiceServer(p.srv, runnerProxy{p: p})
	handoffv1.RegisterWritebackServiceServer(p.srv, writebackProxy{p: p})
	go p.srv.Serve(l)
	return nil
}

func (p *proxy) close() {
	p.srv.Stop()
}

// wait waits for the re-deliveries in flight (bounded).
func (p *proxy) wait(d time.Duration) {
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func (p *proxy) report() RedeliveryReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.redel
}

func (p *proxy) record(f func(r *RedeliveryReport)) {
	p.mu.Lock()
	f(&p.redel)
	p.mu.Unlock()
}

// redeliverNow decides whether this hop is delivered twice.
func (p *proxy) redeliverNow() bool {
	return p.h.cfg.Redeliver > 0 && rngDo(p.h, func(r *rand.Rand) bool { return r.Float64() < p.h.cfg.Redeliver })
}

// copyDelay is how long after the coordinator's copy the duplicate leaves: up to 5ms, so
// either may reach the service first.
func (p *proxy) copyDelay() time.Duration {
	return rngDo(p.h, func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5000)) * time.Microsecond })
}

type runnerProxy struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	p *proxy
}

func (rp runnerProxy) Check(ctx context.Context, req *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	return rp.p.runner.Check(rp.p.forward(ctx), req)
}

func (rp runnerProxy) Deliver(req *handoffv1.DeliverRequest, down grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	p := rp.p
	pkg := req.GetPackage()
	if p.h.hop(fmt.Sprintf("%s/%s/%d", pkg.GetJobId(), pkg.GetStage(), pkg.GetEvaluator().GetRounds())) && p.redeliverNow() {
		p.redeliverDeliver(down.Context(), req)
	}
	job := pkg.GetJobId()
	fail := func(err error) error {
		p.h.resumes.failed(job, p.blame(down.Context(), err, kindRunner)...)
		return err
	}
	up, err := p.runner.Deliver(p.forward(down.Context()), req)
	if err != nil {
		return fail(err)
	}
	first, err := up.Recv()
	if err != nil {
		return fail(err)
	}
	switch first.GetAck().GetStatus() {
	case handoffv1.AckStatus_ACK_STATUS_ACCEPTED, handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
		p.h.resumes.progressed(job)
	}
	if err := down.Send(first); err != nil {
		return fail(err)
	}
	if first.GetAck().GetStatus() == handoffv1.AckStatus_ACK_STATUS_ACCEPTED && p.h.due(faultRunner) {
		// Mid-stage: the runner took the package and is running (or finishing) the stage.
		p.h.killRunner()
	}
	for {
		msg, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fail(err)
		}
		if err := down.Send(msg); err != nil {
			return fail(err)
		}
	}
}

func (p *proxy) redeliverDeliver(caller context.Context, req *handoffv1.DeliverRequest) {
	p.redeliver(caller, func(ctx context.Context) (bool, string, error) {
		// The copy is a full hop as the coordinator makes it: ack, then (after ACCEPTED)
		// the stage's result.
		ack, _, err := rpc.Deliver(ctx, p.runner, req)
		switch st := ack.GetStatus(); {
		case err != nil, st == handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
			return false, "", err
		case st == handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
			return true, "", nil
		default:
			return false, "ack " + st.String(), nil
		}
	})
}

// redeliver sends a copy of a hop in the background after copyDelay, as a second caller
// would (with the caller's metadata: forwardTo), and counts how it was answered. send
// makes the copy and says whether it was answered as a duplicate, or why it was refused
// otherwise; an Aborted error means the first delivery was still in flight.
func (p *proxy) redeliver(caller context.Context, send func(ctx context.Context) (duplicate bool, refused string, err error)) {
	p.record(func(r *RedeliveryReport) { r.Sent++ })
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		time.Sleep(p.copyDelay())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dup, refused, err := send(p.forwardTo(ctx, caller))
		p.record(func(r *RedeliveryReport) {
			switch {
			case status.Code(err) == codes.Aborted:
				r.InFlight++
			case err != nil:
				r.other(reason(err))
			case refused != "":
				r.other(refused)
			case dup:
				r.Duplicate++
			default:
				r.Ran++
			}
		})
	}()
}

type writebackProxy struct {
	handoffv1.UnimplementedWritebackServiceServer
	p *proxy
}

func (wp writebackProxy) Write(ctx context.Context, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	p := wp.p
	if p.h.hop(req.GetPackage().GetJobId()+"/"+req.GetPackage().GetStage()) && p.redeliverNow() {
		p.redeliver(ctx, func(ctx context.Context) (bool, string, error) {
			resp, err := p.wb.Write(ctx, req)
			return resp.GetDuplicate(), "", err
		})
	}
	resp, err := p.wb.Write(p.forward(ctx), req)
	if err == nil && ctx.Err() == nil {
		p.h.resumes.progressed(req.GetPackage().GetJobId())
	} else {
		p.h.resumes.failed(req.GetPackage().GetJobId(), p.blame(ctx, err, kindWriteback)...)
	}
	return resp, err
}

// p.blame is blame on this proxy's layout: when every service is one process (bbolt),
// a call broken by a kill was broken by the kill of that process, whatever kind it was,
// so it blames every kind and the latest kill among them is the one (resumes.failed).
func (p *proxy) blame(callerCtx context.Context, err error, service string) []string {
	kinds := blame(callerCtx, err, service)
	if p.h.lay.oneProcess && len(kinds) > 0 {
		return processKinds
	}
	return kinds
}

// blame is the kinds of kill that fail a call the way it failed: its caller gone (a
// coordinator), the service's connection broken (the service itself), or Unavailable from
// the service's store (a master, or the one Redis). Aborted (in flight elsewhere) and
// other answers blame none.
func blame(callerCtx context.Context, err error, service string) []string {
	switch {
	case callerCtx.Err() != nil:
		return []string{kindCoordinator}
	case status.Code(err) != codes.Unavailable:
		return nil
	case strings.Contains(status.Convert(err).Message(), "store"), strings.Contains(status.Convert(err).Message(), "redis"):
		return []string{kindMaster, kindRedis}
	default:
		return []string{service}
	}
}
