package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
)

var explainHelp = about("explain") + `Usage: handoff explain [flags] RUN_ID

Asks the coordinator (ExplainJob) to read the run's events and answers, for every hop, the
five questions of a hop that lost its context: was job_id the same; which required field
was missing (from the ack's reasons); which evaluator state the stage started with, and
whether it started as if a failed judge had passed; which tools it called that earlier
stages had already burned; which artifacts it read against the ones it was given. Each
answer has a finding (OK, VIOLATION, N/A, UNKNOWN) and its evidence (field paths, stages,
artifact URIs); no package is printed. Then the run's violations: silent reset, stale plan,
burned tool retried, goal changed.

Identity, as for the other commands that call a deployment: --certs DIR (mTLS with the
--as certificate of ` + "`handoff certs`" + `), or --plaintext-loopback with --operator-token (the
token ` + "`handoff up`" + ` prints) or --token-key-file DIR/<service>.key.

Exits 0 when the run has no violation, 1 when it has one or the call failed, 2 on usage
errors.

Flags:`

func runExplain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, explainHelp)
		fs.PrintDefaults()
	}
	var addr, token, as string
	var jsonOut bool
	var sec rpc.Security
	b := config.New(fs)
	b.String(&addr, "coordinator", "HANDOFF_COORDINATOR", "127.0.0.1:50051", "coordinator `ADDR`")
	b.String(&token, "operator-token", "HANDOFF_OPERATOR_TOKEN", "", "call as the operator with this token (authorization: Bearer)")
	b.String(&as, "as", "HANDOFF_AS", "operator", "the `SERVICE` whose --certs certificate or token key identifies the call")
	fs.BoolVar(&jsonOut, "json", false, "print the explanation as JSON (protojson)")
	sec.Bind(b)
	// The flags first, keeping the run id; then the Binder's own check of the environment
	// values (it refuses positional arguments, so it is given none).
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	pos := fs.Args()
	if err := b.Parse(nil); err != nil {
		fmt.Fprintln(stderr, "handoff explain:", err)
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "handoff explain: want exactly one RUN_ID (see --help)")
		return 2
	}
	runID := pos[0]
	if !runIDPattern.MatchString(runID) {
		fmt.Fprintf(stderr, "handoff explain: RUN_ID %q is not a run id (run_<hex>, as GetJob and the demo print)\n", clipArg(runID))
		return 2
	}
	dc, err := sec.Client(as)
	if err != nil {
		fmt.Fprintln(stderr, "handoff explain:", err)
		return 2
	}
	if token != "" {
		dc.PerRPC = identity.OperatorCredentials(token)
	}
	cc, err := rpc.Dial(addr, dc)
	if err != nil {
		fmt.Fprintln(stderr, "handoff explain:", err)
		return 1
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := handoffv1.NewCoordinatorServiceClient(cc).ExplainJob(ctx, &handoffv1.ExplainJobRequest{RunId: runID})
	if err != nil {
		st := status.Convert(err)
		fmt.Fprintf(stderr, "handoff explain: %s: %s\n", st.Code(), st.Message())
		return 1
	}
	ex := resp.GetExplanation()
	if jsonOut {
		b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(ex)
		if err != nil {
			fmt.Fprintln(stderr, "handoff explain:", err)
			return 1
		}
		fmt.Fprintln(stdout, string(b))
	} else {
		printExplanation(stdout, ex)
	}
	if len(ex.GetViolations()) > 0 {
		return 1
	}
	return 0
}

// runIDPattern is a coordinator's run id, checked before any call: run_ and 28 hex digits
// (time-ordered), or 16 (runs made before ids carried their time), and for a sub-job's
// nested run the parent's id with -<stage>-<n> after it, once per level of nesting.
var runIDPattern = regexp.MustCompile(`^run_(?:[0-9a-f]{28}|[0-9a-f]{16})(?:-[a-z][a-z0-9_-]*-[0-9]+)*$`)

func clipArg(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

var questionNames = map[handoffv1.Question]string{
	handoffv1.Question_QUESTION_SAME_JOB:       "same job_id",
	handoffv1.Question_QUESTION_REQUIRED_FIELD: "required field",
	handoffv1.Question_QUESTION_EVALUATOR:      "evaluator",
	handoffv1.Question_QUESTION_BURNED_TOOLS:   "burned tools",
	handoffv1.Question_QUESTION_ARTIFACTS_READ: "artifacts read",
}

var findingNames = map[handoffv1.Finding]string{
	handoffv1.Finding_FINDING_OK:             "OK",
	handoffv1.Finding_FINDING_VIOLATION:      "VIOLATION",
	handoffv1.Finding_FINDING_NOT_APPLICABLE: "N/A",
	handoffv1.Finding_FINDING_UNKNOWN:        "UNKNOWN",
}

// printExplanation writes the explanation as a table: five answers per hop, each with its
// evidence indented below it.
func printExplanation(w io.Writer, ex *handoffv1.Explanation) {
	fmt.Fprintf(w, "explain %s  job %s  pipeline %s  %s\n", ex.GetRunId(), ex.GetJobId(), ex.GetPipeline(), strings.TrimPrefix(ex.GetState().String(), "JOB_STATE_"))
	fmt.Fprintf(w, " %3s  %-10s %-16s %-15s %-10s %s\n", "hop", "stage", "ack", "question", "finding", "answer")
	for _, h := range ex.GetHops() {
		ack := strings.TrimPrefix(h.GetAck().String(), "ACK_STATUS_")
		if h.GetAck() == handoffv1.AckStatus_ACK_STATUS_UNSPECIFIED {
			ack = "-"
		}
		for i, a := range h.GetAnswers() {
			hop, stage, ackCol := "", "", ""
			if i == 0 {
				hop, stage, ackCol = fmt.Sprint(h.GetHop()), h.GetStage(), ack
			}
			fmt.Fprintf(w, " %3s  %-10s %-16s %-15s %-10s %s\n", hop, stage, ackCol, questionNames[a.GetQuestion()], findingNames[a.GetFinding()], a.GetSummary())
			for _, e := range a.GetEvidence() {
				fmt.Fprintf(w, "%61s%s\n", "", evidenceText(e))
			}
		}
	}
	if len(ex.GetViolations()) == 0 {
		fmt.Fprintln(w, "violations: none")
		return
	}
	fmt.Fprintf(w, "violations: %d\n", len(ex.GetViolations()))
	for _, v := range ex.GetViolations() {
		fmt.Fprintf(w, "  hop %d %s: %s: %s\n", v.GetHop(), v.GetStage(), strings.TrimPrefix(v.GetKind().String(), "VIOLATION_KIND_"), v.GetDetail())
		for _, e := range v.GetEvidence() {
			fmt.Fprintf(w, "    %s\n", evidenceText(e))
		}
	}
}

// evidenceText is one evidence item: its field, stage, URI and note, those it has.
func evidenceText(e *handoffv1.Evidence) string {
	var parts []string
	if e.GetField() != "" {
		parts = append(parts, e.GetField())
	}
	if e.GetStage() != "" {
		parts = append(parts, "stage "+e.GetStage())
	}
	if e.GetUri() != "" {
		parts = append(parts, e.GetUri())
	}
	if e.GetNote() != "" {
		parts = append(parts, "("+e.GetNote()+")")
	}
	return "- " + strings.Join(parts, " ")
}
