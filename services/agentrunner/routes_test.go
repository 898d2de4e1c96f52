package agentrunner_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// TestRoutesReachTheAgentAndReplay: the routes the pipeline declares for a stage reach its
// agent; the route it chose is stored with the completion, so a re-delivery's DUPLICATE ack
// carries it (a replayed job takes the same route); and the same stage at the next visit
// (a route sent the job back) is a new completion that runs the agent again, its artifact
// in a folder of its own.
func TestRoutesReachTheAgentAndReplay(t *testing.T) {
	var offered [][]string
	intake := &fake{card: agentrunner.RoleCard{Name: "intake"}}
	intake.run = func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		var names []string
		for _, r := range in.Routes {
			names = append(names, r.GetName()+"="+r.GetDescription())
		}
		offered = append(offered, names)
		res, err := writeOne(ctx, in)
		if err != nil {
			return nil, err
		}
		res.Route = &handoffv1.RouteChoice{Name: "billing", Reason: "a double charge", Priority: handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH}
		return res, nil
	}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{intake}}, "")
	routes := []*handoffv1.RouteOption{{Name: "billing", Description: "money"}, {Name: "unclear", Description: "a person decides"}}
	req := &handoffv1.DeliverRequest{Package: pkg("intake"), Routes: routes}

	first, err := deliver(t, e.client, req)
	if err != nil || len(first) != 2 {
		t.Fatalf("deliver: %v %v", first, err)
	}
	want := &handoffv1.RouteChoice{Name: "billing", Reason: "a double charge", Priority: handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH}
	if got := first[1].GetResult().GetRoute(); !proto.Equal(got, want) {
		t.Fatalf("result route %v, want %v", got, want)
	}
	if len(offered) != 1 || strings.Join(offered[0], ",") != "billing=money,unclear=a person decides" {
		t.Fatalf("agent was offered %v", offered)
	}

	again, err := deliver(t, e.client, req)
	if err != nil || len(again) != 1 || again[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("re-delivery: %v %v; want one DUPLICATE ack", again, err)
	}
	if got := again[0].GetAck().GetPrior().GetRoute(); !proto.Equal(got, want) {
		t.Fatalf("DUPLICATE prior route %v, want the first completion's %v", got, want)
	}

	back := proto.Clone(req).(*handoffv1.DeliverRequest)
	back.Package.Visit = 1
	back.Package.Origin = &handoffv1.Origin{Stage: "billing", Move: handoffv1.Move_MOVE_ROUTE, Route: &handoffv1.RouteChoice{Name: "misfiled"}}
	third, err := deliver(t, e.client, back)
	if err != nil || len(third) != 2 || third[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("second visit: %v %v; want ACCEPTED and a result", third, err)
	}
	if n := intake.calls.Load(); n != 2 {
		t.Fatalf("agent ran %d times, want 2 (first visit, second visit)", n)
	}
	a, b := first[1].GetResult().GetArtifacts()[0].GetUri(), third[1].GetResult().GetArtifacts()[0].GetUri()
	if a == b || !strings.Contains(b, "/intake-r0-v1/") {
		t.Fatalf("second visit's artifact %s (first %s): want its own intake-r0-v1 folder", b, a)
	}
}

func TestVisitKey(t *testing.T) {
	for _, c := range []struct {
		round, returns, visit uint32
		want                  string
	}{
		{0, 0, 0, "stage:job-1:intake:0"},
		{0, 0, 2, "stage:job-1:intake:0:v2"},
		{1, 3, 1, "stage:job-1:intake:1:o3:v1"},
	} {
		if got := agentrunner.VisitKey("job-1", "intake", c.round, c.returns, c.visit); got != c.want {
			t.Errorf("VisitKey(%d, %d, %d) = %q, want %q", c.round, c.returns, c.visit, got, c.want)
		}
	}
	if a, b := agentrunner.VisitKey("j", "s", 2, 1, 0), agentrunner.CompletionKey("j", "s", 2, 1); a != b {
		t.Errorf("a first visit's key %q differs from CompletionKey %q", a, b)
	}
}
