package bench

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/budget"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
)

// floorRig serves figures A2 and R_floor: the agent runner's Deliver method generated
// code registered on a plain grpc.Server (no interceptors, no stats handler, no identity)
// with a handler that does only the durable work the product decision keeps on the hop.
// A2's handler runs the store's own Admit (the claim and the hop debit, one Lua script on
// Redis), sends an ack and a stage result shaped like B's, then writes the Complete, as
// the runner does after sending; its client then saves the run with one PutRun, as B's
// does. R_floor's handler validates the package (figure V) and sends the one refusal.
type floorRig struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	st        store.Store
	prefix    string
	redisAddr string
	val       *contract.Validator
	g         *grpc.Server
	cc        *grpc.ClientConn
	client    handoffv1.AgentRunnerServiceClient
	tmpl      *template
	jobPrefix string
	seq       atomic.Uint64
	workers   []*hopWorker
	shape     hopShape
}

// hopShape is what B's runner returned for one hop (captured from a B hop), so that A2's
// messages and save have B's sizes: the ack's schema, the result's parts, and the value a
// completion record holds.
type hopShape struct {
	schema     string
	artifacts  []*handoffv1.Artifact
	toolsTried []*handoffv1.ToolAttempt
	openQs     []string
	nextHint   string
	evaluator  *handoffv1.Evaluator
	spent      int64
}

func shapeOf(ack *handoffv1.Ack, res *handoffv1.StageResult) hopShape {
	return hopShape{schema: ack.GetSchema(), artifacts: res.GetArtifacts(), toolsTried: res.GetToolsTried(), openQs: res.GetOpenQuestions(),
		nextHint: res.GetNextHint(), evaluator: res.GetEvaluator(), spent: res.GetSpentUsdMicros()}
}

// captureShape runs one B hop and returns what its runner sent.
func (r *hopRig) captureShape(ctx context.Context) (hopShape, error) {
	w := r.workers[0]
	tp := newTraceparent(nil)
	p := r.tmpl.make(r.jobPrefix, tp, w.walletID)
	p.Stage = r.nextStage()
	ack, res, err := rpc.Deliver(onTrace(ctx, tp), r.client, &handoffv1.DeliverRequest{Package: p, Agent: benchStage})
	if err != nil {
		return hopShape{}, err
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		return hopShape{}, fmt.Errorf("shape hop: ack %s, result %s", ack.GetStatus(), res.GetStatus())
	}
	return shapeOf(ack, res), nil
}

// newFloorRig starts the bare Deliver server. redisAddr "" leaves A2 unavailable (R_floor
// only).
func newFloorRig(ctx context.Context, redisAddr string, workers int, val *contract.Validator, shape hopShape) (_ *floorRig, err error) {
	r := &floorRig{val: val, tmpl: newTemplate(benchStage), jobPrefix: "floor-" + randomHex(4), shape: shape}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if redisAddr != "" {
		r.prefix, r.redisAddr = newPrefix("floor"), redisAddr
		if r.st, err = store.OpenRedis(ctx, store.RedisOptions{Addr: redisAddr, Prefix: r.prefix}); err != nil {
			return nil, err
		}
		if r.workers, err = newHopWorkers(ctx, r.st, r.tmpl, r.jobPrefix, max(workers, 1)); err != nil {
			return nil, err
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.g = grpc.NewServer()
	handoffv1.RegisterAgentRunnerServiceServer(r.g, r)
	go r.g.Serve(lis)
	if r.cc, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	r.client = handoffv1.NewAgentRunnerServiceClient(r.cc)
	return r, nil
}

// Deliver is the bare handler. A package with a wallet is A2's hop; one without a goal is
// R_floor's refusal.
func (r *floorRig) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	p := req.GetPackage()
	ack := &handoffv1.Ack{JobId: p.GetJobId(), Stage: p.GetStage(), Traceparent: p.GetTrace().GetTraceparent()}
	if p.GetBudget().GetWalletId() == "" {
		if rs := r.val.CheckV1(p); len(rs) > 0 {
			ack.Status, ack.Reasons = handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, rs
			return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}})
		}
		return status.Error(codes.InvalidArgument, "floor: a package without a wallet must be invalid (R_floor)")
	}
	if r.st == nil {
		return status.Error(codes.Unavailable, "floor: no redis")
	}
	ctx := stream.Context()
	key := p.GetJobId() + "/" + p.GetStage()
	d := budget.HopDebit
	d.Job = p.GetJobId()
	a, err := r.st.Admit(ctx, key, idempotency.DefaultPendingTTL, p.GetBudget().GetWalletId(), d)
	if err != nil {
		return status.Errorf(codes.Unavailable, "floor: admit: %v", err)
	}
	if a.State != store.Claimed || !a.Debited || a.DebitErr != nil {
		return status.Errorf(codes.FailedPrecondition, "floor: admit %s: state %v, debited %v, %v", key, a.State, a.Debited, a.DebitErr)
	}
	ack.Status, ack.Schema, ack.Wallet = handoffv1.AckStatus_ACK_STATUS_ACCEPTED, r.shape.schema, a.Wallet
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}); err != nil {
		return err
	}
	s := r.shape
	res := &handoffv1.StageResult{JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
		Artifacts: s.artifacts, ToolsTried: s.toolsTried, SpentUsdMicros: s.spent, Evaluator: s.evaluator, OpenQuestions: s.openQs,
		NextHint: s.nextHint, Traceparent: p.GetTrace().GetTraceparent()}
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}}); err != nil {
		return err
	}
	// As the runner: the completion record is written after the result is sent.
	val, err := proto.Marshal(res)
	if err != nil {
		return status.Errorf(codes.Internal, "floor: %v", err)
	}
	if err := r.st.Complete(context.WithoutCancel(ctx), key, a.Owner, val, 0); err != nil {
		return status.Errorf(codes.Unavailable, "floor: complete: %v", err)
	}
	return nil
}

// hop is figure A2: a package of B's size delivered on the bare stream (the ack, then the
// result), then the run saved with one PutRun, as B's client does.
func (r *floorRig) hop(ctx context.Context, worker int) error {
	if r.st == nil {
		return fmt.Errorf("floor: A2 needs Redis")
	}
	w := r.workers[worker%len(r.workers)]
	tp := newTraceparent(nil)
	p := r.tmpl.make(r.jobPrefix, tp, w.walletID)
	p.Stage = fmt.Sprintf("%s-%d", benchStage, r.seq.Add(1))
	ack, res, err := rpc.Deliver(ctx, r.client, &handoffv1.DeliverRequest{Package: p, Agent: benchStage})
	if err != nil {
		return err
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		return fmt.Errorf("A2 %s: ack %s, result %s", p.GetStage(), ack.GetStatus(), res.GetStatus())
	}
	return saveHop(ctx, r.st, w.run, p, ack, res)
}

// rejected is figure R_floor: a package without a goal on the bare stream; the one
// message must be the REJECTED_SCHEMA ack.
func (r *floorRig) rejected(ctx context.Context, _ int) error {
	tp := newTraceparent(nil)
	p := r.tmpl.make(fmt.Sprintf("%s-%d", r.jobPrefix, r.seq.Add(1)), tp, "")
	p.Goal = ""
	ack, _, err := rpc.Deliver(ctx, r.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil {
		return err
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || ack.GetTraceparent() != tp {
		return fmt.Errorf("rejected on the floor: ack %s on %s, want REJECTED_SCHEMA on %s", ack.GetStatus(), ack.GetTraceparent(), tp)
	}
	return nil
}

func (r *floorRig) close() {
	if r.cc != nil {
		r.cc.Close()
	}
	if r.g != nil {
		r.g.Stop()
	}
	if r.st != nil {
		r.st.Close()
	}
	if r.prefix != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		deletePrefix(ctx, r.redisAddr, r.prefix)
		cancel()
	}
}
