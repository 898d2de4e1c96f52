package agentrunner_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// TestBadRequestAnswers: over gRPC through the runner's whole chain, a table of bad
// requests gets, from Deliver and from Check, the answer it got before the request was
// checked without its package (ValidateWithout): the same Ack status and reasons, or the same
// InvalidArgument fields and rules. Every rule of the request other than its package still
// runs (the agent's pattern and length, required_tools, routes, "exactly one package"), and
// a request with both packages or with neither is refused naming why. The agent is never
// called.
func TestBadRequestAnswers(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft", Accepts: both, Tools: []string{"search"}}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	v2 := v2pkg(t, "draft", time.Now().Add(time.Hour))
	bad := func() *handoffv1.HandoffPackage { p := pkg("draft"); p.JobId = "bad id!"; return p }
	long := strings.Repeat("x", 129)
	manyTools := make([]string, 65)
	for i := range manyTools {
		manyTools[i] = "search"
	}
	manyRoutes := make([]*handoffv1.RouteOption, 33)
	for i := range manyRoutes {
		manyRoutes[i] = &handoffv1.RouteOption{Name: fmt.Sprintf("r%d", i)}
	}
	for _, c := range []struct {
		name  string
		req   *handoffv1.DeliverRequest
		want  string // Deliver's answer
		check string // Check's, when it differs
	}{
		{"neither package", &handoffv1.DeliverRequest{Agent: "draft"},
			"ack REJECTED_SCHEMA [ required]", ""},
		{"both packages", &handoffv1.DeliverRequest{Package: pkg("draft"), PackageV2: v2},
			"ack REJECTED_SCHEMA [ package.one]", ""},
		{"both packages, the v1 one broken", &handoffv1.DeliverRequest{Package: bad(), PackageV2: v2},
			"ack REJECTED_SCHEMA [ package.one]", ""},
		{"agent off its pattern", &handoffv1.DeliverRequest{Package: pkg("draft"), Agent: "Draft!"},
			"InvalidArgument [agent STRING_PATTERN]", ""},
		{"agent too long", &handoffv1.DeliverRequest{Package: pkg("draft"), Agent: strings.Repeat("d", 65)},
			"InvalidArgument [agent STRING_MAX_LEN]", ""},
		{"a required tool too long", &handoffv1.DeliverRequest{Package: pkg("draft"), RequiredTools: []string{"search", long}},
			"InvalidArgument [required_tools[1] STRING_MAX_LEN]", ""},
		{"too many required tools", &handoffv1.DeliverRequest{Package: pkg("draft"), RequiredTools: manyTools},
			"InvalidArgument [required_tools REPEATED_MAX_ITEMS]", ""},
		{"a route off its pattern", &handoffv1.DeliverRequest{Package: pkg("draft"), Routes: []*handoffv1.RouteOption{{Name: "Bad Route"}}},
			"InvalidArgument [routes[0].name STRING_PATTERN]", "-"},
		{"too many routes", &handoffv1.DeliverRequest{Package: pkg("draft"), Routes: manyRoutes},
			"InvalidArgument [routes REPEATED_MAX_ITEMS]", "-"},
		{"broken package", &handoffv1.DeliverRequest{Package: bad()},
			"ack REJECTED_SCHEMA [job_id string.pattern]", ""},
		{"broken package and agent", &handoffv1.DeliverRequest{Package: bad(), Agent: "Draft!"},
			"ack REJECTED_SCHEMA [job_id string.pattern]", ""},
		{"v2 package, agent off its pattern", &handoffv1.DeliverRequest{PackageV2: v2, Agent: "Draft!"},
			"InvalidArgument [agent STRING_PATTERN]", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			msgs, err := deliver(t, e.client, c.req)
			var got string
			if err != nil {
				got = answer(nil, err)
			} else if len(msgs) == 0 || msgs[0].GetAck() == nil {
				t.Fatalf("deliver: %v", msgs)
			} else {
				got = answer(msgs[0].GetAck(), nil)
			}
			if got != c.want {
				t.Errorf("Deliver: %s, want %s", got, c.want)
			}
			if c.check == "-" {
				return // CheckRequest has no routes
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := e.client.Check(ctx, &handoffv1.CheckRequest{Package: c.req.Package, PackageV2: c.req.PackageV2, Agent: c.req.Agent, RequiredTools: c.req.RequiredTools})
			want := c.want
			if c.check != "" {
				want = c.check
			}
			if got := answer(resp.GetAck(), err); got != want {
				t.Errorf("Check: %s, want %s", got, want)
			}
		})
	}
	if n := ag.calls.Load(); n != 0 {
		t.Fatalf("the agent ran %d times for bad requests", n)
	}
}

// answer is an Ack's status and reasons ("field rule"), or an error's code and its
// BadRequest's fields and reasons, sorted.
func answer(ack *handoffv1.Ack, err error) string {
	var parts []string
	if err != nil {
		st := status.Convert(err)
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				for _, f := range br.GetFieldViolations() {
					parts = append(parts, f.GetField()+" "+f.GetReason())
				}
			}
		}
		slices.Sort(parts)
		return fmt.Sprintf("%s [%s]", st.Code(), strings.Join(parts, ", "))
	}
	for _, r := range ack.GetReasons() {
		parts = append(parts, r.GetField()+" "+r.GetRule())
	}
	slices.Sort(parts)
	return fmt.Sprintf("ack %s [%s]", strings.TrimPrefix(ack.GetStatus().String(), "ACK_STATUS_"), strings.Join(parts, ", "))
}
