package pipeline

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/handoffhq/handoff/pipelines"
)

// want is one expected problem: its rule, line and a key part of its message.
type want struct {
	rule string
	line int
	msg  string
}

func TestLintFixtures(t *testing.T) {
	tests := []struct {
		file     string
		errors   []want // exactly these error-severity problems, in order
		warnings []want // at least these warnings
	}{
		{file: "good.yaml"},
		{file: "two_writers.yaml", errors: []want{
			{"one-writer", 41, `stages "writeback" (line 31) and "audit" both write to system crm`},
		}},
		{file: "mcp.yaml"},
		{file: "mcp_bad.yaml", errors: []want{
			{"mcp-server", 8, `MCP server "crm" has both command: and url:`},
			{"mcp-server", 9, `MCP server "desk" has neither command: (stdio) nor url:`},
			{"mcp-server", 9, `MCP server "desk" is declared twice`},
			{"price", 11, `model "m" has a negative price`},
			{"price", 12, `model "m" is priced twice`},
			{"tool-mcp", 15, `tool "kb.search" is served by MCP server "nowhere", which mcp_servers does not declare`},
			{"max-tool-rounds", 24, `stage "intake" has max_tool_rounds -1`},
		}},
		{file: "judge_write_tool.yaml", errors: []want{
			{"judge-no-write", 31, `judge "judge" holds write tool crm.patch`},
		}},
		{file: "agent_write_tool.yaml", errors: []want{
			{"one-writer", 25, `stage "draft" holds write tool crm.patch for system crm but is not the writer of crm: only writeback stage "writeback" (line 32)`},
		}},
		{file: "identical_stages.yaml", errors: []want{
			{"one-stage", 21, `stages "retrieve" (line 16) and "rerank" (line 21) hold the same tools and criteria: they are one stage`},
		}},
		{file: "unversioned_artifact.yaml", errors: []want{
			{"artifact-version", 23, "output type summary_md has no schema version"},
		}},
		{file: "bad_schema_version.yaml", errors: []want{
			{"artifact-version", 18, `output schema_version "chunks_v1" is not a version`},
			{"artifact-version", 23, "output schema_version summary.v1 is not a version of type summary_md"},
		}},
		{file: "no_output_type.yaml", errors: []want{
			{"artifact-type", 16, `stage "retrieve" names no output artifact type`},
		}},
		{file: "no_max_hops.yaml", errors: []want{
			{"max-hops", 2, "max_hops is required"},
		}},
		{file: "max_grant.yaml", errors: []want{
			{"max-grant", 7, "escalation.max_grant.hops is 1001: it must be between 0 and 1000"},
			{"max-grant", 7, "escalation.max_grant.usd_micros is -1"},
			{"max-open-escalations", 8, "escalation.max_open_escalations is -1"},
			{"escalation-webhook", 9, `escalation.webhook "ftp://nope" is not an http(s) URL`},
			{"when-full", 10, `escalation.when_full is "drop"`},
		}},
		{file: "pii.yaml"},
		{file: "pii_bad.yaml", errors: []want{
			{"pii", 8, `pii.policy is "mask": use reject`},
			{"pii", 10, "pii.patterns[0] (employee_id): regex does not compile"},
			{"pii", 11, "pii.patterns[1] (badge): regex matches the empty text"},
			{"pii", 12, `pii pattern name "badge" is used twice (first as pii.patterns[1])`},
			{"pii", 14, `pii.patterns[4]: name "Card" must be a lower-case word`},
			{"unknown-field", 15, `unknown field "notify" in pii; its fields are policy, patterns`},
		}},
		{file: "max_hops_zero.yaml", errors: []want{
			{"max-hops", 3, "must be greater than 0"},
		}},
		{file: "unknown_field.yaml", errors: []want{
			{"unknown-field", 5, `unknown field "owner" in the pipeline`},
			{"unknown-field", 25, `unknown field "critera" in stage "draft" (did you mean "criteria"?)`},
			{"unknown-field", 26, `unknown field "retries" in stage "draft"`},
		}, warnings: []want{
			{"criteria", 22, `stage "draft" has no evaluator criteria`},
		}},
		{file: "field_type.yaml", errors: []want{
			{"field-type", 3, `max_hops must be a whole number, not "twelve"`},
			{"field-type", 19, `tools must be a list`},
		}},
		{file: "no_judge.yaml", errors: []want{
			{"writeback-gate", 26, `writeback stage "writeback" has no judge before it: writeback never runs without a judge's PASS`},
		}},
		{file: "unjudged_stage.yaml", errors: []want{
			{"writeback-gate", 31, `stage "polish" runs after judge "judge" and before writeback stage "writeback"`},
		}},
		{file: "judge_revise.yaml", errors: []want{
			{"judge-revise", 23, `stage "draft" has revise: retrieve, but only a judge sends work back`},
			{"judge-revise", 28, `judge "judge" revises "writeback", which does not come before it`},
			{"judge-revise", 39, `judge "final_check" has no revise`},
		}},
		{file: "writer_rules.yaml", errors: []want{
			{"writer", 13, `stage "intake" has a writer but is an agent stage`},
			{"writer", 32, `writeback stage "writeback" has no writer`},
		}},
		{file: "writer_system.yaml", errors: []want{
			{"writer", 34, `writes system "crn", which no tool in the catalogue belongs to`},
		}},
		{file: "structure.yaml", errors: []want{
			{"pipeline-name", 2, `pipeline name "Support Ticket" is not valid`},
			{"tool-decl", 10, `tool "kb.fetch" has access "readonly": use read or write`},
			{"unknown-tool", 15, `stage "intake" holds tool "tickets.search", which is not in the tool catalogue`},
			{"duplicate-stage", 17, `stage name "intake" is used twice (first on line 12)`},
			{"stage-kind", 18, `has kind "retriever"`},
			{"runner", 19, `runner "localhost", which is not host:port`},
			{"agent-name", 25, `agent "Drafter", which is not a valid agent name`},
		}, warnings: []want{
			{"unused-tool", 10, `tool "kb.fetch" is in the catalogue but no stage holds it`},
		}},
		{file: "stage_input.yaml", errors: []want{
			{"stage-input", 22, `stage "draft" reads chunks.v2, but no stage before it outputs chunks.v2 (earlier outputs: intake.v1, chunks.v1)`},
		}},
		{file: "limits.yaml", errors: []want{
			{"escalation", 2, "escalation.route is required"},
			{"max-revisions", 4, "max_revisions is -1"},
			{"stale-revision", 5, `stale_revision is "sometimes": it must be "revise"`},
		}},
		{file: "no_stages.yaml", errors: []want{
			{"no-stages", 10, "the pipeline has no stages"},
		}},
		// The graph rules of a pipeline with routes.
		{file: "routed_good.yaml"},
		{file: "route_target.yaml", errors: []want{
			{"route-target", 17, `route "refund" of stage "intake" goes to "drafts", which is not a stage of this pipeline`},
		}},
		{file: "unreachable.yaml", errors: []want{
			{"reachable", 18, `stage "translate" is not reachable from the first stage "intake"`},
		}},
		{file: "route_to_writeback.yaml", errors: []want{
			{"writeback-gate", 17, `writeback stage "writeback" is reachable from stage "intake" by route "urgent", without a judge's PASS`},
		}},
		{file: "duplicate_route.yaml", errors: []want{
			{"duplicate-route", 17, `stage "intake" declares route "billing" twice`},
		}},
		{file: "cycle.yaml", errors: []want{
			{"cycle", 18, "stages tidy -> sort -> tidy form a cycle that passes through no judge, and only fixed moves"},
		}, warnings: []want{
			{"cycle", 10, "stages intake -> draft -> intake form a cycle that passes through no judge: only max_bounces (2) and the hop cap"},
		}},
		{file: "writeback_input.yaml", errors: []want{
			{"writeback-input", 28, `writeback stage "writeback" writes chunks.v1, but judge "judge", whose PASS leads to it, judges summary_md.v1`},
		}},
		{file: "end_by_order.yaml", errors: []want{
			{"route-end", 34, `stage "retrieve-b" is the last stage and moves nowhere, but a job reaches it before its write`},
		}},
		{file: "route_end.yaml", errors: []want{
			{"route-end", 17, `route "spam" of stage "intake" ends the job, but a job reaches "intake" before its write`},
		}},
		{file: "judge_feeder.yaml", errors: []want{
			{"judge-revise", 22, `judge "judge" is reached from stage "technical-draft" by its next:, which it does not revise`},
		}},
		{file: "fallback_first.yaml", warnings: []want{
			{"cycle", 9, "stages a -> b -> a form a cycle that passes through no judge"},
		}},
		{file: "routes.yaml", errors: []want{
			{"max-bounces", 6, "max_bounces is -1"},
			{"route-name", 18, `stage "intake" has route "Billing", which is not a valid route name`},
			{"route-description", 19, `route "refund" of stage "intake" has no description`},
			{"route-target", 20, `route "other" of stage "intake" has no to`},
			{"routes", 21, `stage "intake" has both routes and next: draft`},
			{"route-target", 22, `rejected_role: intake-backup, which is not a stage`},
			{"stage-name", 23, `stage name "end" is reserved`},
			{"reachable", 23, `stage "end" is not reachable`},
			{"routes", 38, `judge "judge" has routes`},
		}},
		// Fan-out: hard partitions, declared failure and wallet policies, merges, sub-jobs.
		{file: "parallel_good.yaml"},
		{file: "parallel_shared_output.yaml", errors: []want{
			{"partition-output", 19, `branch "history" of stage "lookups" owns output type notes, which branch "policy" also owns`},
		}},
		{file: "parallel_shared_write_tool.yaml", errors: []want{
			{"branch-writes", 14, `branch "policy" of stage "lookups" owns write tool crm.patch (system crm): no branch writes externally`},
			{"partition-write-tool", 19, `branch "history" of stage "lookups" owns write tool crm.patch, which branch "policy" also owns`},
			{"branch-writes", 19, `branch "history" of stage "lookups" owns write tool crm.patch`},
		}},
		{file: "parallel_shared_writer.yaml", errors: []want{
			{"branch-writes", 16, `stage "crm-a" of branch "a" of stage "lookups" is a writer`},
			{"partition-writer", 22, `stage "crm-b" of branch "b" of stage "lookups" writes system "crm", which branch "a" also writes`},
			{"branch-writes", 22, `stage "crm-b" of branch "b" of stage "lookups" is a writer`},
		}},
		{file: "parallel_bad.yaml", errors: []want{
			{"on-wallet-empty", 3, `on_wallet_empty is "shrug"`},
			{"merge", 9, `parallel stage "lookups" is not followed by a merge`},
			{"on-branch-failure", 11, `on_branch_failure "ignore"`},
			{"field-type", 12, `branch_timeout "soon" is not a positive duration`},
			{"parallel", 14, `stage "lookups" has 1 branches`},
			{"partition", 18, `outputs other, which its branch does not own (outputs: policy_notes)`},
			{"duplicate-stage", 19, `stage name "lookups" is used twice`},
			{"subjob", 29, `runs its own pipeline parallel-bad as a sub-job`},
			{"subjob", 29, `subjob.objective is empty`},
			{"subjob", 29, `outputs summary_md.v1 but its sub-job returns summary.v1`},
			{"subjob", 29, `subjob.stop "never"`},
			{"subjob", 29, `subjob.max_hops must be greater than 0`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			p, problems, err := Parse(path, data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if p == nil {
				t.Fatal("Parse returned no pipeline")
			}
			var errs, warns []Problem
			for _, pr := range problems {
				if pr.File != path || pr.Line <= 0 || pr.Col <= 0 {
					t.Errorf("problem without a position: %+v", pr)
				}
				if pr.IsError() {
					errs = append(errs, pr)
				} else {
					warns = append(warns, pr)
				}
			}
			if len(errs) != len(tt.errors) {
				t.Errorf("got %d errors, want %d:\n%s", len(errs), len(tt.errors), lines(errs))
			}
			for i, w := range tt.errors {
				if i >= len(errs) {
					break
				}
				checkProblem(t, errs[i], w)
			}
			for _, w := range tt.warnings {
				i := slices.IndexFunc(warns, func(pr Problem) bool { return pr.Rule == w.rule && pr.Line == w.line })
				if i < 0 {
					t.Errorf("missing warning %s on line %d; warnings:\n%s", w.rule, w.line, lines(warns))
					continue
				}
				checkProblem(t, warns[i], w)
			}
			if HasErrors(problems) != (len(tt.errors) > 0) {
				t.Errorf("HasErrors = %v", HasErrors(problems))
			}
		})
	}
}

func checkProblem(t *testing.T, got Problem, w want) {
	t.Helper()
	if got.Rule != w.rule || got.Line != w.line || !strings.Contains(got.Message, w.msg) {
		t.Errorf("got  %s\nwant rule %s, line %d, message containing %q", got, w.rule, w.line, w.msg)
	}
}

func lines(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("  " + p.String() + "\n")
	}
	return b.String()
}

func TestShippedPipelinesLintClean(t *testing.T) {
	files, err := PipelineFiles(pipelines.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "support-ticket.yaml") {
		t.Fatalf("pipelines.FS holds %v, want support-ticket.yaml", files)
	}
	for _, f := range files {
		data, err := fs.ReadFile(pipelines.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		_, problems, err := Parse(f, data)
		if err != nil || len(problems) > 0 {
			t.Errorf("%s: err=%v, problems (warnings included):\n%s", f, err, lines(problems))
		}
	}

	all, err := LoadAll(pipelines.FS)
	if err != nil {
		t.Fatal(err)
	}
	p := all["support-ticket"]
	if p == nil {
		t.Fatalf("LoadAll: no support-ticket in %v", all)
	}
	if p.MaxHops != 12 || p.MaxRevisions != 2 || p.Escalation.Route != "support-leads" || p.Source != "support-ticket.yaml" {
		t.Errorf("limits: %+v", p)
	}
	var names []string
	for _, s := range p.Stages {
		names = append(names, s.Name)
	}
	if want := []string{"intake", "retrieve", "draft", "judge", "writeback"}; !slices.Equal(names, want) {
		t.Errorf("stages %v, want %v", names, want)
	}

	// The accessors the coordinator uses.
	if f := p.First(); f == nil || f.Name != "intake" || f.Input != "raw_ticket.v1" || f.AgentName() != "intake" {
		t.Errorf("First = %+v", f)
	}
	if n, ok := p.Next("draft"); !ok || n.Name != "judge" {
		t.Errorf("Next(draft) = %v, %v", n, ok)
	}
	if n, ok := p.Next("writeback"); ok || n != nil {
		t.Errorf("Next(writeback) = %v, %v; want none", n, ok)
	}
	if _, ok := p.Next("nope"); ok {
		t.Error("Next(nope) found a stage")
	}
	judge, i, ok := p.Stage("judge")
	if !ok || i != 3 || judge.Kind != KindJudge || judge.Revise != "draft" || !judge.IsJudge() || judge.Line == 0 {
		t.Errorf("Stage(judge) = %+v, %d, %v", judge, i, ok)
	}
	if d, _, _ := p.Stage("draft"); d.Kind != KindAgent || d.AgentName() != "draft" || len(p.ToolsOf(d)) != 0 {
		t.Errorf("draft = %+v", d)
	}
	wb, _, _ := p.Stage("writeback")
	if !wb.IsWriteback() || wb.Writer == nil || *wb.Writer != (Writer{System: "crm", Target: "ledger"}) || wb.Input != "summary_md.v1" {
		t.Errorf("writeback = %+v", wb)
	}
	if tools := p.ToolsOf(wb); len(tools) != 1 || tools[0] != (Tool{Name: "crm.patch", Access: AccessWrite, System: "crm"}) {
		t.Errorf("ToolsOf(writeback) = %+v", tools)
	}
	if o := wb.Output; o != (Output{Type: "crm_receipt", SchemaVersion: "crm_receipt.v1"}) {
		t.Errorf("writeback output = %+v", o)
	}
	if _, _, ok := p.Stage("nope"); ok {
		t.Error("Stage(nope) found a stage")
	}
}

// The shipped pipeline with routes, as the coordinator reads it.
func TestSupportTriage(t *testing.T) {
	p, err := LoadFS(pipelines.FS, "support-triage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxBounces != 2 || !p.HasRoutes() || !p.Writes() {
		t.Errorf("max_bounces %d, routes %v, writes %v", p.MaxBounces, p.HasRoutes(), p.Writes())
	}
	intake := p.First()
	if got := intake.RouteNames(); !slices.Equal(got, []string{"billing", "technical", "unclear"}) {
		t.Errorf("intake routes %v", got)
	}
	if r, ok := intake.Route("unclear"); !ok || r.To != ToEscalate || r.Description == "" {
		t.Errorf("Route(unclear) = %+v, %v", r, ok)
	}
	if _, ok := intake.Route("shipping"); ok {
		t.Error("Route(shipping) found a route intake does not declare")
	}
	for _, desk := range []string{"billing", "technical"} {
		r, _, _ := p.Stage(desk + "-retrieve")
		if hit, _ := r.Route("hit"); hit.To != desk+"-draft" {
			t.Errorf("%s-retrieve hit -> %q", desk, hit.To)
		}
		if nh, _ := r.Route("no_hit"); nh.To != "no-match-note" {
			t.Errorf("%s-retrieve no_hit -> %q", desk, nh.To)
		}
		// next: overrides file order.
		if n, ok := p.Next(desk + "-draft"); !ok || n.Name != "judge" {
			t.Errorf("Next(%s-draft) = %v, %v; want judge", desk, n, ok)
		}
	}
	judge, _, _ := p.Stage("judge")
	if got := judge.ReviseStages(); !slices.Equal(got, []string{"billing-draft", "technical-draft", "no-match-note"}) || judge.Revise != "billing-draft" {
		t.Errorf("judge revises %v (Revise %q)", got, judge.Revise)
	}
	// Without max_bounces the default holds.
	ticket, err := LoadFS(pipelines.FS, "support-ticket.yaml")
	if err != nil || ticket.MaxBounces != DefaultMaxBounces || ticket.HasRoutes() {
		t.Errorf("support-ticket: %v, max_bounces %d, routes %v", err, ticket.MaxBounces, ticket.HasRoutes())
	}
}

func TestLoadRefusesBadPipeline(t *testing.T) {
	path := filepath.Join("testdata", "structure.yaml")
	p, err := Load(path)
	if err == nil || p != nil {
		t.Fatalf("Load = %v, %v; want an error", p, err)
	}
	var perr *Error
	if !errors.As(err, &perr) || perr.File != path || len(perr.Problems) < 7 {
		t.Fatalf("err = %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"pipeline testdata/structure.yaml has 7 problems:",
		"\ntestdata/structure.yaml:2:7: pipeline-name: ",
		"\ntestdata/structure.yaml:17:11: duplicate-stage: ",
		"\ntestdata/structure.yaml:10:12: unused-tool: warning: ",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error misses %q:\n%s", want, msg)
		}
	}
	// One problem per line after the heading.
	if got := strings.Count(msg, "\n"); got != len(perr.Problems) {
		t.Errorf("%d lines for %d problems:\n%s", got, len(perr.Problems), msg)
	}

	if p, err := Load(filepath.Join("testdata", "good.yaml")); err != nil || p.Name != "support-ticket" || len(p.Stages) != 5 {
		t.Errorf("Load(good) = %v, %v", p, err)
	}
	if _, err := Load(filepath.Join("testdata", "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}

func TestSyntaxError(t *testing.T) {
	path := filepath.Join("testdata", "syntax_error.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, problems, err := Parse(path, data)
	var se *SyntaxError
	if !errors.As(err, &se) || p != nil || problems != nil {
		t.Fatalf("Parse = %v, %v, %v; want a *SyntaxError", p, problems, err)
	}
	if se.Line == 0 || !strings.HasPrefix(err.Error(), path+":") || !strings.Contains(err.Error(), "yaml-syntax: the file is not valid YAML") {
		t.Errorf("syntax error = %q (line %d)", err, se.Line)
	}
	if _, err := Load(path); !errors.As(err, &se) {
		t.Errorf("Load = %v; want the syntax error", err)
	}
}

func TestParseOddDocuments(t *testing.T) {
	tests := []struct {
		name, doc string
		want      want
	}{
		{"empty", "", want{"empty-file", 1, "the file is empty"}},
		{"comment only", "# nothing\n", want{"empty-file", 1, "the file is empty"}},
		{"list", "- a\n- b\n", want{"field-type", 1, "must be a YAML mapping"}},
		{"two documents", "name: a\n---\nname: b\n", want{"multiple-documents", 2, "more than one YAML document"}},
		{"duplicate key", "name: a\nname: b\n", want{"duplicate-field", 2, `field "name" appears twice in the pipeline (first on line 1)`}},
		{"stage not a mapping", "stages: [draft]\n", want{"field-type", 1, "stage 1 must be a mapping"}},
		{"merge key", "stages:\n  - <<: {name: a}\n", want{"unknown-field", 2, "merge keys are not supported"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, problems, err := Parse("x.yaml", []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(problems, func(p Problem) bool { return p.Rule == tt.want.rule })
			if i < 0 {
				t.Fatalf("no %s problem in:\n%s", tt.want.rule, lines(problems))
			}
			checkProblem(t, problems[i], tt.want)
		})
	}
}

func TestLintPipelineBuiltInCode(t *testing.T) {
	p := &Pipeline{
		Name:       "built",
		MaxHops:    5,
		Escalation: Escalation{Route: "leads"},
		Tools:      []Tool{{Name: "crm.patch", Access: AccessWrite, System: "crm"}},
		Stages: []Stage{
			{Name: "draft", Input: "ticket.v1", Output: Output{Type: "summary", SchemaVersion: "summary.v1"}, Criteria: []string{"a"}, Line: 3},
			{Name: "judge", Kind: KindJudge, Revise: "draft", Input: "summary.v1", Output: Output{Type: "verdict", SchemaVersion: "verdict.v1"}, Tools: []string{"crm.patch"}, Criteria: []string{"b"}},
		},
	}
	problems := Lint(p)
	if len(problems) != 1 || problems[0].Rule != "judge-no-write" {
		t.Fatalf("problems:\n%s", lines(problems))
	}
	// No position: "file: rule: message".
	if got := problems[0].String(); !strings.HasPrefix(got, "pipeline: judge-no-write: judge \"judge\" holds write tool crm.patch") {
		t.Errorf("String() = %q", got)
	}
	// A stage with a Line but no parsed positions is reported at that line.
	p.Stages[1].Tools = nil
	p.Tools = nil
	p.Stages[0].Output.SchemaVersion = ""
	problems = Lint(p)
	if len(problems) != 1 || problems[0].Rule != "artifact-version" || problems[0].Line != 3 {
		t.Fatalf("problems:\n%s", lines(problems))
	}
}

func TestProblemString(t *testing.T) {
	p := Problem{File: "a.yaml", Line: 3, Col: 5, Rule: "one-writer", Message: "m"}
	if got := p.String(); got != "a.yaml:3:5: one-writer: m" {
		t.Errorf("error: %q", got)
	}
	p.Severity = SeverityWarning
	if got := p.String(); got != "a.yaml:3:5: one-writer: warning: m" {
		t.Errorf("warning: %q", got)
	}
	if HasErrors([]Problem{p}) {
		t.Error("a warning counts as an error")
	}
}

func TestLoadAllAndDir(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(string(good), "name: support-ticket", "name: other", 1)

	ps, err := LoadAll(fstest.MapFS{
		"a.yaml":     {Data: good},
		"b.yml":      {Data: []byte(other)},
		"notes.txt":  {Data: []byte("not a pipeline")},
		"sub/c.yaml": {Data: []byte("broken: [")},
	})
	if err != nil || len(ps) != 2 || ps["support-ticket"].Source != "a.yaml" || ps["other"].Source != "b.yml" {
		t.Fatalf("LoadAll = %v, %v", ps, err)
	}

	_, err = LoadAll(fstest.MapFS{
		"a.yaml": {Data: good},
		"b.yaml": {Data: good},
		"c.yaml": {Data: []byte("name: c\n")},
	})
	if err == nil || !strings.Contains(err.Error(), `b.yaml:2:7: pipeline-name: pipeline "support-ticket" is also declared in a.yaml`) ||
		!strings.Contains(err.Error(), "c.yaml:1:1: max-hops:") || strings.Count(err.Error(), "pipeline-name") != 1 {
		t.Errorf("LoadAll with a duplicate and a bad file: %v", err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "st.yaml"), good, 0o644); err != nil {
		t.Fatal(err)
	}
	ps, err = LoadDir(dir)
	if err != nil || ps["support-ticket"] == nil || ps["support-ticket"].Source != filepath.Join(dir, "st.yaml") {
		t.Errorf("LoadDir = %v, %v", ps, err)
	}
	if _, err := LoadFS(pipelines.FS, "support-ticket.yaml"); err != nil {
		t.Errorf("LoadFS(shipped) = %v", err)
	}
}

// FuzzParse checks that no input makes Parse panic, and that every problem has a rule and a
// message. The fixtures are the seed corpus.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, problems, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		for _, p := range problems {
			if p.Rule == "" || p.Message == "" {
				t.Fatalf("problem without rule or message: %+v", p)
			}
		}
	})
}

// TestMCPCatalogue: the catalogue maps each tool to its MCP server and tool; the stage's
// model settings are read.
func TestMCPCatalogue(t *testing.T) {
	p, err := Load("testdata/mcp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kb, ok := p.Tool("kb.search")
	if !ok || kb.MCP == nil || kb.MCP.Server != "desk" || kb.MCP.Tool != "kb_search" || kb.Access != AccessRead {
		t.Fatalf("kb.search %+v", kb)
	}
	if len(p.MCPServers) != 2 || !slices.Equal(p.MCPServers[0].Command, []string{"ticket-tools", "--stdio"}) || p.MCPServers[1].URL != "http://127.0.0.1:7070/mcp" {
		t.Fatalf("servers %+v", p.MCPServers)
	}
	if len(p.Prices) != 2 || p.Prices[1] != (Price{"gpt-4o-mini", 150, 600}) {
		t.Fatalf("prices %+v", p.Prices)
	}
	in := p.Stages[0]
	if in.MaxToolRounds != 3 || in.Instructions == "" || in.Output.JSONSchema != "schemas/intake.json" {
		t.Fatalf("intake %+v", in)
	}
}
