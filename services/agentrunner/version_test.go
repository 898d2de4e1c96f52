package agentrunner_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

var both = []string{contract.V1, contract.V2}

// v2pkg is pkg(stage) as handoff.v2, due at deadline.
func v2pkg(t *testing.T, stage string, deadline time.Time) *handoffv2.HandoffPackage {
	t.Helper()
	p, err := contract.V1ToV2(pkg(stage), deadline)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func firstAck(t *testing.T, msgs []*handoffv1.DeliverResponse, err error) *handoffv1.Ack {
	t.Helper()
	if err != nil || len(msgs) == 0 || msgs[0].GetAck() == nil {
		t.Fatalf("deliver: %v %v", msgs, err)
	}
	return msgs[0].GetAck()
}

func deliverAck(t *testing.T, c handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) *handoffv1.Ack {
	t.Helper()
	msgs, err := deliver(t, c, req)
	return firstAck(t, msgs, err)
}

// A Go runner serves handoff.v2 over gRPC: the agent gets the v2 package as sent (and its v1
// view), the Ack answers as v2, and a v1 re-delivery of the same stage is the same completion.
func TestServesV2(t *testing.T) {
	var mu sync.Mutex
	var got *handoffv2.HandoffPackage
	draft := &fake{card: agentrunner.RoleCard{Name: "draft", Accepts: both}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		mu.Lock()
		got = in.V2
		mu.Unlock()
		if in.Package.GetSchema() != contract.V1 || in.Package.GetJobId() != in.V2.GetJobId() {
			t.Errorf("v1 view: %v", in.Package)
		}
		return writeOne(ctx, in)
	}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{draft}}, "")
	sent := v2pkg(t, "draft", time.Now().Add(time.Hour))
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{PackageV2: sent})
	ack := firstAck(t, msgs, err)
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || ack.GetSchema() != contract.V2 {
		t.Fatalf("ack = %v, want ACCEPTED as handoff.v2", ack)
	}
	if len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("result: %v", msgs)
	}
	mu.Lock()
	testkit.Equal(t, got, sent, "the v2 package the agent got")
	mu.Unlock()

	again := deliverAck(t, e.client, &handoffv1.DeliverRequest{Package: pkg("draft")})
	if again.GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE || again.GetSchema() != contract.V1 {
		t.Fatalf("v1 re-delivery: %v, want DUPLICATE as handoff.v1", again)
	}
	if n := draft.calls.Load(); n != 1 {
		t.Fatalf("agent ran %d times, want 1", n)
	}
}

// A package of a version the agent does not declare is REJECTED_SCHEMA naming the version,
// on Deliver and Check, and the agent is not called.
func TestUndeclaredVersionRejected(t *testing.T) {
	old := &fake{card: agentrunner.RoleCard{Name: "draft", Accepts: []string{contract.V1}}}
	next := &fake{card: agentrunner.RoleCard{Name: "judge", Accepts: []string{contract.V2}}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{old, next}}, "")
	dl := time.Now().Add(time.Hour)
	for _, c := range []struct {
		name    string
		req     *handoffv1.DeliverRequest
		version string
	}{
		{"v2 to a v1 agent", &handoffv1.DeliverRequest{PackageV2: v2pkg(t, "draft", dl)}, contract.V2},
		{"v1 to a v2 agent", &handoffv1.DeliverRequest{Package: pkg("judge")}, contract.V1},
	} {
		t.Run(c.name, func(t *testing.T) {
			check, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: c.req.Package, PackageV2: c.req.PackageV2})
			if err != nil {
				t.Fatal(err)
			}
			for _, ack := range []*handoffv1.Ack{deliverAck(t, e.client, c.req), check.GetAck()} {
				r := ack.GetReasons()
				if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || len(r) != 1 ||
					r[0].GetField() != "schema" || r[0].GetRule() != contract.RuleVersionAccepted || !strings.Contains(r[0].GetMessage(), `"`+c.version+`"`) {
					t.Fatalf("ack = %v, want REJECTED_SCHEMA naming %s", ack, c.version)
				}
			}
		})
	}
	if old.calls.Load()+next.calls.Load() != 0 {
		t.Fatal("an agent ran for a version it does not declare")
	}
	both := deliverAck(t, e.client, &handoffv1.DeliverRequest{Package: pkg("draft"), PackageV2: v2pkg(t, "draft", dl)})
	if both.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || both.GetReasons()[0].GetRule() != agentrunner.RulePackageOne {
		t.Fatalf("both versions in one request: %v", both)
	}
}

// Describe reports what each agent declares, and follows a card that changes its versions.
func TestDescribe(t *testing.T) {
	card := &switchable{name: "draft"}
	card.accepts.Store(&[]string{contract.V1})
	judge := &fake{card: agentrunner.RoleCard{Name: "judge", Tools: []string{"rubric"}}}
	v, err := contract.NewValidator(contract.V1)
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, agentrunner.Options{Validator: v, Agents: []agentrunner.Agent{card, judge}}, "")
	describe := func() map[string][]string {
		r, err := e.client.Describe(context.Background(), &handoffv1.DescribeRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, a := range r.GetAgents() {
			out[a.GetName()] = a.GetAccepts()
		}
		return out
	}
	testkit.Equal(t, describe(), map[string][]string{"draft": {contract.V1}, "judge": {contract.V1}}, "declared")
	card.accepts.Store(&both)
	testkit.Equal(t, describe(), map[string][]string{"draft": both, "judge": {contract.V1}}, "after the upgrade")
	ack := deliverAck(t, e.client, &handoffv1.DeliverRequest{PackageV2: v2pkg(t, "draft", time.Now().Add(time.Hour))})
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("v2 after the upgrade: %v", ack)
	}
}

// A v2 package past its budget.deadline is REJECTED_BUDGET naming budget.deadline, before
// the agent runs or the wallet pays; one before it is accepted.
func TestV2DeadlineEnforced(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	draft := &fake{card: agentrunner.RoleCard{Name: "draft", Accepts: both}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{draft}, Now: func() time.Time { return now }}, "")
	for _, dl := range []time.Time{now, now.Add(-time.Hour)} {
		ack := deliverAck(t, e.client, &handoffv1.DeliverRequest{PackageV2: v2pkg(t, "draft", dl)})
		r := ack.GetReasons()
		if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetSchema() != contract.V2 || len(r) != 1 ||
			r[0].GetField() != "budget.deadline" || r[0].GetRule() != contract.RuleBudgetDeadline {
			t.Fatalf("deadline %s at %s: %v, want REJECTED_BUDGET budget.deadline", dl, now, ack)
		}
	}
	if n := draft.calls.Load(); n != 0 {
		t.Fatalf("agent ran %d times past the deadline", n)
	}
	if ack := deliverAck(t, e.client, &handoffv1.DeliverRequest{PackageV2: v2pkg(t, "draft", now.Add(time.Second))}); ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("before the deadline: %v", ack)
	}
}
