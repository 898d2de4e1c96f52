package support_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// rail is a minimal stand-in for the coordinator: it keeps the job's artifacts, open
// questions and evaluator, and builds the package for each stage.
type rail struct {
	t         *testing.T
	store     artifact.Store
	v         *contract.Validator
	jobID     string
	artifacts []*handoffv1.Artifact
	open      []string
	tools     []*handoffv1.ToolAttempt
	ev        *handoffv1.Evaluator
	spent     int64
	cons      []string
}

func newRail(t *testing.T, ticket []byte) *rail {
	t.Helper()
	st, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	r := &rail{t: t, store: st, v: v, jobID: "job-1042",
		cons: []string{"no refund promises", "do not send to customer", "keep it under 400 words"}}
	if ticket != nil {
		a, err := st.Put(context.Background(), artifact.Ref{
			JobID: r.jobID, Stage: "input", Type: support.TypeRawTicket,
			SchemaVersion: support.SchemaRawTicket, MediaType: support.MediaJSON,
		}, ticket)
		if err != nil {
			t.Fatal(err)
		}
		r.artifacts = append(r.artifacts, a)
	}
	return r
}

func (r *rail) pkg(stage string) *handoffv1.HandoffPackage {
	p := &handoffv1.HandoffPackage{
		Schema: contract.V1, JobId: r.jobID, Stage: stage,
		Goal:          "Triage the support ticket into an internal summary",
		Constraints:   r.cons,
		Artifacts:     slices.Clone(r.artifacts),
		OpenQuestions: slices.Clone(r.open),
		ToolsTried:    slices.Clone(r.tools),
		Evaluator:     r.ev,
		Budget:        &handoffv1.Budget{UsdRemainingMicros: 100000 - r.spent, RevisionsRemaining: 2, HopsRemaining: 10},
		Trace:         &handoffv1.Trace{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	if reasons := r.v.CheckV1(p); reasons != nil {
		r.t.Fatalf("test built an invalid package: %v", reasons)
	}
	return p
}

// run runs one agent on the package for stage and applies its result like the rail does.
func (r *rail) run(ag agentrunner.Agent, stage string) *handoffv1.StageResult {
	r.t.Helper()
	p := r.pkg(stage)
	res, err := ag.Run(context.Background(), agentrunner.Input{Package: p, Round: p.GetEvaluator().GetRounds(), Artifacts: r.store})
	if err != nil {
		r.t.Fatalf("%s: %v", stage, err)
	}
	if err := r.v.Validate(res); err != nil {
		r.t.Fatalf("%s: invalid result: %v", stage, err)
	}
	if res.SpentUsdMicros <= 0 {
		r.t.Errorf("%s: spent %d, want > 0", stage, res.SpentUsdMicros)
	}
	r.spent += res.SpentUsdMicros
	r.artifacts = append(r.artifacts, res.Artifacts...)
	r.open = append(r.open, res.OpenQuestions...)
	r.tools = append(r.tools, res.ToolsTried...)
	if res.Evaluator != nil {
		r.ev = res.Evaluator
	}
	return res
}

func (r *rail) read(a *handoffv1.Artifact) []byte {
	r.t.Helper()
	data, err := r.store.Get(context.Background(), a.GetUri())
	if err != nil {
		r.t.Fatal(err)
	}
	if err := artifact.Verify(a, data); err != nil {
		r.t.Fatal(err)
	}
	return data
}

func TestSampleTicket(t *testing.T) {
	var tk support.RawTicket
	if err := json.Unmarshal(support.SampleTicket(), &tk); err != nil {
		t.Fatal(err)
	}
	if tk.TicketID == "" || tk.CustomerID == "" || !strings.Contains(tk.Body, "refund") {
		t.Fatalf("sample ticket: %+v", tk)
	}
	b := support.SampleTicket()
	b[0] = 'x'
	if support.SampleTicket()[0] == 'x' {
		t.Fatal("SampleTicket shares its buffer")
	}
	names := []string{}
	for _, a := range support.Agents() {
		names = append(names, a.Card().Name)
	}
	if !slices.Equal(names, []string{"intake", "retrieve", "draft", "judge", "policy-lookup", "history-lookup", "brief"}) {
		t.Fatalf("agents %v", names)
	}
}

func TestCorpus(t *testing.T) {
	arts, err := support.Corpus()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"hc-cancel-subscription", "hc-contact-hours", "hc-double-charge", "hc-password-reset", "hc-refund-policy", "hc-shipping-delays"}
	var got []string
	for _, a := range arts {
		got = append(got, a.Key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("corpus keys %v, want %v", got, want)
	}
	for _, tc := range []struct{ q, top string }{
		{"I forgot my password and cannot sign in", "hc-password-reset"},
		{"my parcel delivery is late, no tracking update", "hc-shipping-delays"},
		{"how do I cancel my subscription before renewal", "hc-cancel-subscription"},
		{"what are your phone support hours", "hc-contact-hours"},
		{"I was charged twice, duplicate charge on my card", "hc-double-charge"},
		{"can I get my money back, refund please", "hc-refund-policy"},
	} {
		hits, err := support.Search(tc.q, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) == 0 || hits[0].Key != tc.top {
			t.Errorf("Search(%q) = %v, want top %s", tc.q, hits, tc.top)
		}
	}
	if hits, _ := support.Search("banana bread recipe with walnuts", 3); len(hits) != 0 {
		t.Errorf("unrelated query hit %v", hits)
	}
}

// The sample ticket runs intake -> retrieve -> draft -> judge FAIL (citation_missing) ->
// draft (revision) -> judge PASS.
func TestPipelineCritiqueLoop(t *testing.T) {
	r := newRail(t, support.SampleTicket())

	res := r.run(support.NewIntake(), "intake")
	var it support.Intake
	if err := json.Unmarshal(r.read(res.Artifacts[0]), &it); err != nil {
		t.Fatal(err)
	}
	if it.TicketID != "T-1042" || it.CustomerID != "cus_9" || it.Category != "billing_double_charge" || !strings.Contains(it.Question, "refund") {
		t.Fatalf("intake %+v", it)
	}
	if !slices.Contains(it.Facts, "reference: INV-2031") || !slices.Contains(it.Facts, "amount: $49.00") {
		t.Errorf("intake facts %v", it.Facts)
	}
	if a := res.Artifacts[0]; a.Type != "intake" || a.SchemaVersion != "intake.v1" || a.ProducedBy != "intake" {
		t.Errorf("intake artifact %v", a)
	}
	if len(res.ToolsTried) != 1 || res.ToolsTried[0].Name != "tickets.get" || !res.ToolsTried[0].Ok || res.ToolsTried[0].Stage != "intake" {
		t.Errorf("intake tools %v", res.ToolsTried)
	}
	if !slices.ContainsFunc(res.OpenQuestions, func(q string) bool { return strings.Contains(q, "timezone") }) {
		t.Errorf("intake open questions %v: want the missing timezone", res.OpenQuestions)
	}

	res = r.run(support.NewRetrieve(), "retrieve")
	var ch support.Chunks
	if err := json.Unmarshal(r.read(res.Artifacts[0]), &ch); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range ch.Chunks {
		keys = append(keys, c.Key)
	}
	if ch.NoHit || len(keys) == 0 || keys[0] != "hc-double-charge" || !slices.Contains(keys, "hc-refund-policy") {
		t.Fatalf("retrieve chunks %v no_hit=%v", keys, ch.NoHit)
	}
	if len(res.ToolsTried) != 1 || res.ToolsTried[0].Name != "kb.search" || !res.ToolsTried[0].Ok {
		t.Errorf("retrieve tools %v", res.ToolsTried)
	}

	res = r.run(support.NewDraft(), "draft")
	first := string(r.read(res.Artifacts[0]))
	if res.Artifacts[0].MediaType != "text/markdown" || res.Artifacts[0].SchemaVersion != "summary_md.v1" {
		t.Errorf("draft artifact %v", res.Artifacts[0])
	}
	if !strings.Contains(first, "[hc-double-charge]") || strings.Contains(strings.ToLower(first), "dear") {
		t.Errorf("first draft:\n%s", first)
	}

	res = r.run(support.NewJudge(), "judge")
	ev := res.Evaluator
	if ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL || ev.GetRounds() != 1 || len(ev.GetFailures()) != 1 || ev.Failures[0].Code != "citation_missing" {
		t.Fatalf("first verdict %v\n%s", ev, first)
	}
	var vd support.Verdict
	if err := json.Unmarshal(r.read(res.Artifacts[0]), &vd); err != nil {
		t.Fatal(err)
	}
	if vd.Verdict != "fail" || vd.Round != 1 || len(vd.CheckedConstraints) != 3 || len(vd.IgnoredConstraints) != 0 {
		t.Errorf("verdict artifact %+v", vd)
	}

	res = r.run(support.NewDraft(), "draft")
	second := string(r.read(res.Artifacts[0]))
	if second == first || res.Artifacts[0].Uri == r.artifacts[3].Uri {
		t.Fatal("revision did not write a new summary")
	}
	if !strings.Contains(res.NextHint, "citation_missing") {
		t.Errorf("revision hint %q", res.NextHint)
	}

	res = r.run(support.NewJudge(), "judge")
	if ev := res.Evaluator; ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS || ev.GetRounds() != 2 || len(ev.GetFailures()) != 0 {
		t.Fatalf("second verdict %v\n%s", ev, second)
	}
	if r.spent != support.SpendIntake+support.SpendRetrieve+2*support.SpendDraft+2*support.SpendJudge {
		t.Errorf("spent %d", r.spent)
	}
	t.Logf("passing summary:\n%s", second)
}

// judgeOn runs the judge on a hand-written summary with the sample's chunks.
func judgeOn(t *testing.T, summary string, constraints ...string) *handoffv1.Evaluator {
	t.Helper()
	r := newRail(t, support.SampleTicket())
	r.cons = constraints
	r.run(support.NewIntake(), "intake")
	r.run(support.NewRetrieve(), "retrieve")
	a, err := r.store.Put(context.Background(), artifact.Ref{
		JobID: r.jobID, Stage: "draft", Type: support.TypeSummary, SchemaVersion: support.SchemaSummary, MediaType: support.MediaMarkdown,
	}, []byte(summary))
	if err != nil {
		t.Fatal(err)
	}
	r.artifacts = append(r.artifacts, a)
	return r.run(support.NewJudge(), "judge").Evaluator
}

func codes(ev *handoffv1.Evaluator) []string {
	var out []string
	for _, f := range ev.GetFailures() {
		out = append(out, f.GetCode())
	}
	return out
}

func TestJudgeRubric(t *testing.T) {
	good := "# Triage\n\n> internal note\n\n- Billing decides refunds. [hc-refund-policy]\n- Pending charges drop off. [hc-double-charge]\n\n## Open questions\n\n- timezone?\n"
	for _, tc := range []struct {
		name    string
		summary string
		cons    []string
		want    []string
	}{
		{"pass", good, []string{"no refund promises", "do not send to customer"}, nil},
		{"refund promise", "- The charge was a duplicate and we will refund you in full. [hc-double-charge]\n", nil, []string{"refund_promise"}},
		{"guarantee", "- We guarantee a refund within 5 days. [hc-refund-policy]\n", nil, []string{"refund_promise"}},
		{"invalid key", "- Billing decides refunds. [hc-made-up]\n", nil, []string{"citation_invalid"}},
		{"missing", "- Billing decides refunds.\n- Pending charges drop off. [hc-double-charge]\n", nil, []string{"citation_missing"}},
		{"empty", "# Only a heading\n", nil, []string{"citation_missing"}},
		{"greeting", "Dear customer,\n\n- Billing decides refunds. [hc-refund-policy]\n", []string{"Do not send to customer"}, []string{"citation_missing", "constraint_broken"}},
		{"greeting without the constraint", "- Hi Sam, billing decides refunds. [hc-refund-policy]\n", nil, nil},
		{"word limit", good, []string{"at most 10 words"}, []string{"constraint_broken"}},
		{"pii", "- Card 4242 4242 4242 4242 was charged twice. [hc-double-charge]\n", []string{"no PII in the summary"}, []string{"constraint_broken"}},
		{"unknown constraint ignored", good, []string{"answer in French"}, nil},
		{"markdown link is no citation", "- See [the policy](https://example.com).\n", nil, []string{"citation_missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := judgeOn(t, tc.summary, tc.cons...)
			got := codes(ev)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("failures %v, want %v (%v)", got, tc.want, ev.GetFailures())
			}
			want := handoffv1.Verdict_VERDICT_PASS
			if len(tc.want) > 0 {
				want = handoffv1.Verdict_VERDICT_FAIL
			}
			if ev.GetLastVerdict() != want || ev.GetRounds() != 1 {
				t.Fatalf("evaluator %v", ev)
			}
		})
	}
}

// A revision after refund_promise / constraint_broken failures still produces a clean draft.
func TestDraftRevisesForEachCode(t *testing.T) {
	r := newRail(t, support.SampleTicket())
	r.run(support.NewIntake(), "intake")
	r.run(support.NewRetrieve(), "retrieve")
	r.ev = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1, Failures: []*handoffv1.Failure{
		{Code: "refund_promise", Detail: "line 5 promises a refund"},
		{Code: "constraint_broken", Detail: "greeting"},
		{Code: "tone_off", Detail: "too casual"},
	}}
	res := r.run(support.NewDraft(), "draft")
	for _, c := range []string{"refund_promise", "constraint_broken"} {
		if !strings.Contains(res.NextHint, c) {
			t.Errorf("hint %q does not mention %s", res.NextHint, c)
		}
	}
	if len(res.OpenQuestions) != 1 || !strings.Contains(res.OpenQuestions[0], "tone_off") {
		t.Errorf("open questions %v", res.OpenQuestions)
	}
	if ev := r.run(support.NewJudge(), "judge").Evaluator; ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS || ev.GetRounds() != 2 {
		t.Fatalf("verdict on revision %v", ev)
	}
}

func TestRetrieveNoHit(t *testing.T) {
	r := newRail(t, nil)
	a, err := r.store.Put(context.Background(), artifact.Ref{
		JobID: r.jobID, Stage: "intake", Type: support.TypeIntake, SchemaVersion: support.SchemaIntake, MediaType: support.MediaJSON,
	}, []byte(`{"ticket_id":"T-7","customer_id":"cus_1","category":"general","question":"What is a good banana bread recipe with walnuts?","facts":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	r.artifacts = append(r.artifacts, a)
	res := r.run(support.NewRetrieve(), "retrieve")
	var ch support.Chunks
	if err := json.Unmarshal(r.read(res.Artifacts[0]), &ch); err != nil {
		t.Fatal(err)
	}
	if !ch.NoHit || len(ch.Chunks) != 0 {
		t.Fatalf("chunks %+v, want no_hit", ch)
	}
	if !strings.HasPrefix(res.NextHint, "no_hit") || !res.ToolsTried[0].Ok {
		t.Errorf("result %v", res)
	}
	// draft refuses to write from memory on no_hit.
	p := r.pkg("draft")
	if _, err := support.NewDraft().Run(context.Background(), agentrunner.Input{Package: p, Artifacts: r.store}); err == nil || !strings.Contains(err.Error(), "no_hit") {
		t.Fatalf("draft on no_hit: err %v", err)
	}
}

func TestIntakeFailsClosed(t *testing.T) {
	for name, ticket := range map[string]string{
		"no ticket id": `{"customer_id":"cus_1","subject":"x","body":"y"}`,
		"not json":     `ticket: 1`,
		"empty":        `{"ticket_id":"T-1"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := newRail(t, []byte(ticket))
			p := r.pkg("intake")
			if _, err := support.NewIntake().Run(context.Background(), agentrunner.Input{Package: p, Artifacts: r.store}); err == nil {
				t.Fatal("want an error")
			}
		})
	}
	// No raw_ticket at all.
	r := newRail(t, nil)
	if _, err := support.NewIntake().Run(context.Background(), agentrunner.Input{Package: r.pkg("intake"), Artifacts: r.store}); err == nil || !strings.Contains(err.Error(), "raw_ticket") {
		t.Fatalf("err %v", err)
	}
}

func TestIntakeTamperedArtifact(t *testing.T) {
	r := newRail(t, support.SampleTicket())
	r.artifacts[0].Sha256 = strings.Repeat("0", 64)
	if _, err := support.NewIntake().Run(context.Background(), agentrunner.Input{Package: r.pkg("intake"), Artifacts: r.store}); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("err %v", err)
	}
}

// offer are the routes of support-triage's intake and retrievers.
var (
	intakeRoutes   = []*handoffv1.RouteOption{{Name: "billing"}, {Name: "technical"}, {Name: "unclear"}}
	retrieveRoutes = []*handoffv1.RouteOption{{Name: "hit"}, {Name: "no_hit"}}
)

// runOffered runs ag like run, offering routes.
func (r *rail) runOffered(ag agentrunner.Agent, stage string, routes []*handoffv1.RouteOption, origin *handoffv1.Origin) *handoffv1.StageResult {
	r.t.Helper()
	p := r.pkg(stage)
	p.Origin = origin
	res, err := ag.Run(context.Background(), agentrunner.Input{Package: p, Round: p.GetEvaluator().GetRounds(), Artifacts: r.store, Routes: routes})
	if err != nil {
		r.t.Fatalf("%s: %v", stage, err)
	}
	if err := r.v.Validate(res); err != nil {
		r.t.Fatalf("%s: invalid result: %v", stage, err)
	}
	r.artifacts = append(r.artifacts, res.Artifacts...)
	r.open = append(r.open, res.OpenQuestions...)
	if res.Evaluator != nil {
		r.ev = res.Evaluator
	}
	return res
}

// TestTriageRoutes: offered routes, intake answers the ticket's topic and retrieve whether an
// article matched; without routes they answer none (support-ticket is unchanged).
func TestTriageRoutes(t *testing.T) {
	for _, tc := range []struct {
		ticket, topic, retrieved string
		prio                     handoffv1.RoutePriority
	}{
		{"billing", "billing", "hit", handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH},
		{"technical", "technical", "hit", handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL},
		{"no-match", "technical", "no_hit", handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL},
		{"unclear", "unclear", "", handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL},
	} {
		t.Run(tc.ticket, func(t *testing.T) {
			data, err := support.Ticket(tc.ticket)
			if err != nil {
				t.Fatal(err)
			}
			r := newRail(t, data)
			res := r.runOffered(support.NewIntake(), "intake", intakeRoutes, nil)
			var it support.Intake
			if err := json.Unmarshal(r.read(res.Artifacts[0]), &it); err != nil {
				t.Fatal(err)
			}
			if it.Topic != tc.topic || res.GetRoute().GetName() != tc.topic || res.GetRoute().GetPriority() != tc.prio || !strings.Contains(res.GetRoute().GetReason(), it.Category) {
				t.Fatalf("intake topic %q (category %s), route %v; want %s at %s", it.Topic, it.Category, res.GetRoute(), tc.topic, tc.prio)
			}
			if tc.retrieved == "" {
				return
			}
			res = r.runOffered(support.NewRetrieve(), tc.topic+"-retrieve", retrieveRoutes, nil)
			if res.GetRoute().GetName() != tc.retrieved {
				t.Fatalf("retrieve route %v, want %s", res.GetRoute(), tc.retrieved)
			}
		})
	}
	r := newRail(t, support.SampleTicket())
	if res := r.run(support.NewIntake(), "intake"); res.GetRoute() != nil {
		t.Fatalf("intake without routes answered route %v", res.GetRoute())
	}
	if _, err := support.Ticket("shipping"); err == nil {
		t.Fatal("Ticket(shipping) found a ticket")
	}
}

// TestNoMatchNote: the drafter a retriever's no_hit route sent the job to writes a note that
// says nothing matched and cites nothing, and the judge passes it; sent there any other way,
// it still refuses to draft from memory.
func TestNoMatchNote(t *testing.T) {
	data, err := support.Ticket("no-match")
	if err != nil {
		t.Fatal(err)
	}
	r := newRail(t, data)
	r.runOffered(support.NewIntake(), "intake", intakeRoutes, nil)
	r.runOffered(support.NewRetrieve(), "technical-retrieve", retrieveRoutes, nil)
	noHit := &handoffv1.Origin{Stage: "technical-retrieve", Move: handoffv1.Move_MOVE_ROUTE, Route: &handoffv1.RouteChoice{Name: "no_hit"}}
	p := r.pkg("no-match-note")
	if _, err := support.NewDraft().Run(context.Background(), agentrunner.Input{Package: p, Artifacts: r.store}); err == nil || !strings.Contains(err.Error(), "no_hit") {
		t.Fatalf("draft on no_hit without the route: err %v; want a refusal", err)
	}
	res := r.runOffered(support.NewDraft(), "no-match-note", nil, noHit)
	note := string(r.read(res.Artifacts[0]))
	if !strings.Contains(note, "No matching help-center article") || strings.Contains(note, "[hc-") || !strings.Contains(note, "T-2090") {
		t.Fatalf("note:\n%s", note)
	}
	if ev := r.runOffered(support.NewJudge(), "judge", nil, nil).Evaluator; ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS {
		t.Fatalf("verdict on the note %v\n%s", ev, note)
	}
	t.Logf("note:\n%s", note)
}
