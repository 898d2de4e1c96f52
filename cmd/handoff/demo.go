package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"google.golang.org/grpc"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, about("demo")+"Usage: handoff demo [flags]\n\nStarts the platform in-process on the embedded store, runs the sample support ticket\nthrough intake, retrieve, draft, judge (one FAIL, a revision, a PASS) and writeback,\nprints the hop timeline, then submits the same job again to show DUPLICATE and no\nsecond write. Exits 0 when the job completed and exactly one write happened.\n\nWith --pipeline support-triage it runs a billing, a technical and an unclear ticket\nthrough the pipeline with routes instead, printing the route the rail took after each\nhop: the first two go to their desks and are written once each, the third is handed\nto a person by intake's route. Exits 0 when exactly that happened.\n\nWith --pipeline research-brief it runs the sample ticket through a policy lookup and an\naccount-history lookup in parallel, a merge that judges both results, a sub-job of\nsupport-ticket that drafts the summary on the job's wallet, and one write. It prints the\nbranches side by side and exits 0 when they overlapped, the merge passed, the sub-job\nreturned its artifact and exactly one write happened.\n\nThe runner's agents declare handoff.v1 only; --v2-stage names agents that also read\nhandoff.v2 (a rolling upgrade, one stage at a time): the rail sends them v2, converted\nfrom the run, and their hop lines show [handoff.v2].\n\nWith --explain it then prints the first run explained hop by hop, as 'handoff explain'\ndoes: five answers per hop with their evidence, no package printed.\n\nFlags:")
		fs.PrintDefaults()
	}
	var f stackFlags
	var pipelineName, v2Stages string
	var explain bool
	b := config.New(fs)
	fs.BoolVar(&explain, "explain", false, "after the demo, explain its first run hop by hop (handoff explain): five answers per hop, no package printed")
	b.String(&pipelineName, "pipeline", "HANDOFF_DEMO_PIPELINE", demo.Pipeline, "the shipped pipeline to run: "+demo.Pipeline+", "+demo.TriagePipeline+" or "+demo.ResearchPipeline)
	b.String(&v2Stages, "v2-stage", "HANDOFF_DEMO_V2_STAGE", "", "comma-separated agents (stages) of the runner that also read handoff.v2, e.g. draft")
	// Free ports and a fresh folder by default, so the demo runs beside `handoff up`.
	bindStack(b, &f, "", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "")
	if err := b.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 2
	}
	if explain && pipelineName == demo.TriagePipeline {
		fmt.Fprintf(stderr, "handoff demo: --explain: the %s demo runs three jobs; explain one with 'handoff explain RUN_ID'\n", demo.TriagePipeline)
		return 2
	}
	if pipelineName != demo.Pipeline && pipelineName != demo.TriagePipeline && pipelineName != demo.ResearchPipeline {
		fmt.Fprintf(stderr, "handoff demo: --pipeline %q: the demo runs %s, %s or %s\n", pipelineName, demo.Pipeline, demo.TriagePipeline, demo.ResearchPipeline)
		return 2
	}
	if f.data == "" {
		dir, err := os.MkdirTemp("", "handoff-demo-")
		if err != nil {
			fmt.Fprintln(stderr, "handoff demo:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		f.data = dir
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := f.config(stderr)
	for _, n := range strings.Split(v2Stages, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cfg.V2Agents = append(cfg.V2Agents, n)
		}
	}
	st, err := stack.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	defer st.Close()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	if pipelineName == demo.TriagePipeline {
		return triageDemo(ctx, stdout, stderr, st, cc)
	}
	if pipelineName == demo.ResearchPipeline {
		code, runID := researchDemo(ctx, stdout, stderr, st, cc)
		if code == 0 && explain {
			code = explainDemo(ctx, stdout, stderr, cc, runID)
		}
		return code
	}
	res, err := demo.Run(ctx, stdout, cc, st.Artifacts)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	writes, err := st.Store.LedgerEntries(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nexternal writes in the ledger: %d (two submits of one job)\n", len(writes))
	if res.First.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || len(writes) != 1 {
		fmt.Fprintf(stderr, "handoff demo: expected a completed job and exactly one write; got %s and %d writes\n", res.First.GetState(), len(writes))
		return 1
	}
	if explain {
		return explainDemo(ctx, stdout, stderr, cc, res.First.GetRunId())
	}
	return 0
}

// explainDemo prints the demo's run explained hop by hop, as handoff explain does.
func explainDemo(ctx context.Context, stdout, stderr io.Writer, cc grpc.ClientConnInterface, runID string) int {
	resp, err := handoffv1.NewCoordinatorServiceClient(cc).ExplainJob(ctx, &handoffv1.ExplainJobRequest{RunId: runID})
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo: explain:", err)
		return 1
	}
	fmt.Fprintln(stdout)
	printExplanation(stdout, resp.GetExplanation())
	return 0
}

// triageDemo runs the support-triage tickets and checks what the demo promises: the billing
// and the technical ticket completed and are written once each, the unclear one escalated by
// intake's route, and nothing else was written.
func triageDemo(ctx context.Context, stdout, stderr io.Writer, st *stack.Stack, cc grpc.ClientConnInterface) int {
	runs, err := demo.RunTriage(ctx, stdout, cc, st.Artifacts)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	writes, err := st.Store.LedgerEntries(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nexternal writes in the ledger: %d (the billing and the technical ticket; the unclear one went to a person)\n", len(writes))
	ok := len(runs) == 3 && len(writes) == 2
	for i, r := range runs {
		want := handoffv1.JobState_JOB_STATE_COMPLETED
		if i == 2 {
			want = handoffv1.JobState_JOB_STATE_ESCALATED
			ok = ok && r.Job.GetEscalation().GetCause() == handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTED
		}
		ok = ok && r.Job.GetState() == want
	}
	if !ok {
		var got []string
		for _, r := range runs {
			got = append(got, r.Ticket+" "+r.Job.GetState().String())
		}
		fmt.Fprintf(stderr, "handoff demo: expected billing and technical COMPLETED, unclear ESCALATED by its route, and two writes; got %v and %d writes\n", got, len(writes))
		return 1
	}
	return 0
}

// researchDemo runs research-brief and checks what the demo promises: both branches ran at
// overlapping times and completed, the merge ran once, the sub-job returned its artifact,
// the job completed, and exactly one write happened.
func researchDemo(ctx context.Context, stdout, stderr io.Writer, st *stack.Stack, cc grpc.ClientConnInterface) (int, string) {
	run, err := demo.RunResearch(ctx, stdout, cc, st.Artifacts)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1, ""
	}
	writes, err := st.Store.LedgerEntries(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1, ""
	}
	fmt.Fprintf(stdout, "\nexternal writes in the ledger: %d\n", len(writes))
	merges := 0
	for _, ev := range run.Events {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_VERDICT && ev.GetStage() == "brief" {
			merges++
		}
	}
	var problems []string
	if run.Job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		problems = append(problems, "the job ended "+run.Job.GetState().String())
	}
	if !demo.Overlap(run.Job) {
		problems = append(problems, "the branches did not run at overlapping times")
	}
	for _, b := range run.Job.GetBranches() {
		if b.GetStatus() != handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED {
			problems = append(problems, "branch "+b.GetBranch()+" ended "+b.GetStatus().String())
		}
	}
	if merges != 1 {
		problems = append(problems, fmt.Sprintf("the merge judged %d times", merges))
	}
	if c := run.Job.GetChildren(); len(c) != 1 || c[0].GetArtifact() == nil {
		problems = append(problems, "the sub-job returned no artifact")
	}
	if len(writes) != 1 {
		problems = append(problems, fmt.Sprintf("%d writes", len(writes)))
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "handoff demo: research-brief: %s\n", strings.Join(problems, "; "))
		return 1, ""
	}
	return 0, run.Job.GetRunId()
}
