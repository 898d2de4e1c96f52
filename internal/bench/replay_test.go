package bench

import (
	"context"
	"io"
	"testing"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

func TestGenerateDealsEveryKind(t *testing.T) {
	items, err := generate(ReplayConfig{N: 200, Invalid: 0.10, Duplicate: 0.05, Seed: 7, Stage: "replay"}, "rp-test")
	if err != nil {
		t.Fatal(err)
	}
	v, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[Kind]int{}
	seenValid := map[int]bool{}
	for i, it := range items {
		counts[it.kind]++
		switch it.kind {
		case KindValid:
			seenValid[i] = true
			if rs := v.CheckV1(it.pkg); len(rs) > 0 {
				t.Fatalf("valid package #%d is invalid: %v", i, rs)
			}
		case KindDuplicate:
			if !seenValid[it.orig] || it.pkg.GetJobId() != items[it.orig].pkg.GetJobId() {
				t.Fatalf("duplicate #%d does not re-deliver an earlier valid package (orig %d)", i, it.orig)
			}
		default:
			schemaBroken := len(v.CheckV1(it.pkg)) > 0
			if want := Expected(it.kind) == handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA; schemaBroken != want {
				t.Fatalf("%s package #%d: schema broken %v, want %v", it.kind, i, schemaBroken, want)
			}
		}
	}
	if counts[KindValid] != 170 || counts[KindDuplicate] != 10 {
		t.Fatalf("counts %v, want 170 valid and 10 duplicates", counts)
	}
	for _, k := range InvalidKinds {
		if counts[k] < 2 {
			t.Fatalf("kind %s dealt %d times, want at least 2 of 20 invalid", k, counts[k])
		}
	}
}

// acceptAll is a broken runner: it accepts every package without running anything.
type acceptAll struct {
	handoffv1.AgentRunnerServiceClient
}

type oneAck struct {
	grpc.ServerStreamingClient[handoffv1.DeliverResponse]
	msgs []*handoffv1.DeliverResponse
}

func (s *oneAck) Recv() (*handoffv1.DeliverResponse, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (acceptAll) Deliver(_ context.Context, req *handoffv1.DeliverRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[handoffv1.DeliverResponse], error) {
	p := req.GetPackage()
	return &oneAck{msgs: []*handoffv1.DeliverResponse{
		{Event: &handoffv1.DeliverResponse_Ack{Ack: contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)}},
		{Event: &handoffv1.DeliverResponse_Result{Result: &handoffv1.StageResult{JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED, Traceparent: p.GetTrace().GetTraceparent()}}},
	}}, nil
}

// TestReplayFailsABrokenRunner: a runner that accepts everything must fail the replay, with
// every invalid and duplicate package counted wrong.
func TestReplayFailsABrokenRunner(t *testing.T) {
	rep, err := Replay(context.Background(), ReplayConfig{N: 100, Invalid: 0.2, Duplicate: 0.1, Seed: 3, Runner: acceptAll{}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.Wrong != 30 {
		t.Fatalf("OK %v, wrong %d; want a failed replay with 30 wrong statuses (%v)", rep.OK, rep.Wrong, rep.Failures)
	}
	if rep.AgentCallsForRejected != "unknown" {
		t.Fatalf("agent calls for rejected = %v, want unknown without a counter", rep.AgentCallsForRejected)
	}
}
