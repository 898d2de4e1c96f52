package hop_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/testkit"
)

const check = handoffv1.AgentRunnerService_Check_FullMethodName

func TestRejectionReject(t *testing.T) {
	reasons := []*handoffv1.Reason{{Field: "package.job_id", Rule: "required", Message: "m"}}
	resp := &handoffv1.CheckResponse{}
	var calls []string
	hook := func(method string, rs []*handoffv1.Reason) {
		calls = append(calls, "hook "+method)
		if len(rs) != 1 || rs[0] != reasons[0] {
			t.Errorf("hook got %v; want the reasons", rs)
		}
	}
	answer := func(ok bool, resp proto.Message) hop.Rejecter {
		return func(method string, req proto.Message, rs []*handoffv1.Reason) (proto.Message, bool) {
			calls = append(calls, "rejecter "+method)
			return resp, ok
		}
	}
	for _, c := range []struct {
		name      string
		r         hop.Rejection
		wantOK    bool
		wantCalls []string
	}{
		{"nothing set", hop.Rejection{}, false, nil},
		{"hook only", hop.Rejection{OnReject: hook}, false, []string{"hook /m"}},
		{"answers", hop.Rejection{OnReject: hook, Rejecter: answer(true, resp)}, true, []string{"hook /m", "rejecter /m"}},
		{"declines", hop.Rejection{Rejecter: answer(false, resp)}, false, []string{"rejecter /m"}},
		{"ok with nil resp", hop.Rejection{Rejecter: answer(true, nil)}, false, []string{"rejecter /m"}},
	} {
		calls = nil
		got, ok := c.r.Reject("/m", &handoffv1.CheckRequest{}, reasons)
		if ok != c.wantOK || (ok && got != resp) {
			t.Errorf("%s: Reject = %v, %v; want ok=%v", c.name, got, ok, c.wantOK)
		}
		if !slices.Equal(calls, c.wantCalls) {
			t.Errorf("%s: calls %q; want %q", c.name, calls, c.wantCalls)
		}
	}
}

func TestAckResponse(t *testing.T) {
	ack := &handoffv1.Ack{JobId: "job-1"}
	resp, ok := hop.AckResponse(deliver, ack)
	if d, isD := resp.(*handoffv1.DeliverResponse); !ok || !isD || d.GetAck() != ack {
		t.Errorf("AckResponse(Deliver) = %v, %v; want DeliverResponse{ack}", resp, ok)
	}
	resp, ok = hop.AckResponse(check, ack)
	if c, isC := resp.(*handoffv1.CheckResponse); !ok || !isC || c.GetAck() != ack {
		t.Errorf("AckResponse(Check) = %v, %v; want CheckResponse{ack}", resp, ok)
	}
	if resp, ok := hop.AckResponse(handoffv1.WritebackService_Write_FullMethodName, ack); ok || resp != nil {
		t.Errorf("AckResponse(Write) = %v, %v; want nil, false", resp, ok)
	}
}

func TestAckRejecter(t *testing.T) {
	budget := handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET
	reasons := []*handoffv1.Reason{
		{Field: "package.budget.hops_remaining", Rule: "budget.empty", Message: "no hops"},
		{Field: "agent", Rule: "required", Message: "no agent"},
		{Field: "package", Rule: "required", Message: "value is required"},
		{Field: "packages", Rule: "x", Message: "not the package"},
	}
	want := []*handoffv1.Reason{
		{Field: "budget.hops_remaining", Rule: "budget.empty", Message: "no hops"},
		{Rule: "required", Message: "value is required"},
	}
	req := &handoffv1.CheckRequest{Package: pkg()}
	resp, ok := hop.AckRejecter(budget, nil)(check, req, reasons)
	if !ok {
		t.Fatal("AckRejecter declined Check")
	}
	wantAck := contract.AckFor(req.GetPackage(), budget, want...)
	testkit.Equal(t, resp, &handoffv1.CheckResponse{Ack: wantAck}, "Check's answer")
	if got := resp.(*handoffv1.CheckResponse).GetAck(); got.GetJobId() != "job-1" || got.GetTraceparent() != tp {
		t.Errorf("ack %v does not echo the package", got)
	}
	if reasons[0].GetField() != "package.budget.hops_remaining" {
		t.Error("AckRejecter modified the reasons")
	}

	// whole rewrites the message of a reason about the package as a whole; a Deliver answers
	// with DeliverResponse; no package gives an Ack without identity.
	whole := func(r *handoffv1.Reason) string { return "whole: " + r.GetRule() }
	resp, ok = hop.AckRejecter(budget, whole)(deliver, &handoffv1.DeliverRequest{}, reasons)
	want[1] = &handoffv1.Reason{Rule: "required", Message: "whole: required"}
	wantAck = contract.AckFor(nil, budget, want...)
	if !ok || !proto.Equal(resp, &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: wantAck}}) {
		t.Errorf("Deliver: %v, %v; want DeliverResponse{%v}", resp, ok, wantAck)
	}

	// Declines: another method; no reason about the package; a request of another type.
	if resp, ok := hop.AckRejecter(budget, nil)(handoffv1.WritebackService_Write_FullMethodName, req, reasons); ok || resp != nil {
		t.Errorf("Write: %v, %v; want a decline", resp, ok)
	}
	if resp, ok := hop.AckRejecter(budget, nil)(check, req, reasons[1:2]); ok || resp != nil {
		t.Errorf("only agent: %v, %v; want a decline", resp, ok)
	}
	resp, ok = hop.AckRejecter(budget, nil)(check, &handoffv1.GetJobRequest{}, reasons[:1])
	if !ok || resp.(*handoffv1.CheckResponse).GetAck().GetJobId() != "" {
		t.Errorf("request without GetPackage: %v, %v; want an Ack without identity", resp, ok)
	}
}
