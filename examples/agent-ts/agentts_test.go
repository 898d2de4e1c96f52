// The TypeScript agent runner against the Go platform: the shipped support-ticket pipeline
// with its draft stage routed (`runner:`) to the Node process, on a stack whose Go runner has
// no draft agent, so only the Node runner can serve that stage.
//
// Needs node and npm; runs `npm ci` here when node_modules is missing. Without node or npm it
// skips, or fails when CI is set.
package agentts_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/pipelines"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// requireNode returns node's path, installing the example's pinned packages on first use.
func requireNode(t *testing.T) string {
	t.Helper()
	node, nerr := exec.LookPath("node")
	npm, perr := exec.LookPath("npm")
	if err := errors.Join(nerr, perr); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs node and npm for the TypeScript agent runner: %v", err)
		}
		t.Skipf("node or npm not installed: %v", err)
	}
	if _, err := os.Stat(filepath.Join("node_modules", "@bufbuild", "protovalidate")); err == nil {
		if _, err := os.Stat(filepath.Join("node_modules", ".bin", "tsx")); err == nil {
			return node
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in examples/agent-ts: %v\n%s", err, out)
	}
	return node
}

// nodeRunner is the TypeScript runner process and the JSON lines it logged, one per call.
type nodeRunner struct {
	addr   string
	mu     sync.Mutex
	calls  []map[string]any
	stderr bytes.Buffer
}

func (r *nodeRunner) records() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// count returns how many records match every key/value of want, waiting up to 5 s for at
// least n (a line is written just before its answer is sent, so it may still be in the pipe).
func (r *nodeRunner) count(n int, want map[string]any) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := 0
		for _, rec := range r.records() {
			ok := true
			for k, v := range want {
				if rec[k] != v {
					ok = false
					break
				}
			}
			if ok {
				got++
			}
		}
		if got >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startRunner starts `node --import tsx src/runner.ts --port 0` and waits for its
// "listening on 127.0.0.1:PORT" line.
func startRunner(t *testing.T, node, artifacts string) *nodeRunner {
	t.Helper()
	r := &nodeRunner{}
	cmd := exec.Command(node, "--import", "tsx", "src/runner.ts", "--port", "0", "--artifacts", artifacts)
	cmd.Stderr = &syncWriter{mu: &r.mu, w: &r.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the TypeScript runner: %v", err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			r.mu.Lock()
			t.Logf("TypeScript runner stderr:\n%s", r.stderr.String())
			r.mu.Unlock()
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			if addr, ok := strings.CutPrefix(line, "listening on "); ok {
				ready <- addr
				continue
			}
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil {
				r.mu.Lock()
				r.calls = append(r.calls, rec)
				r.mu.Unlock()
			}
		}
		cmd.Wait()
		close(exited)
	}()
	select {
	case r.addr = <-ready:
	case <-exited:
		t.Fatalf("the TypeScript runner exited before listening:\n%s", r.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the TypeScript runner did not print its address within 30s:\n%s", r.stderr.String())
	}
	if !strings.HasPrefix(r.addr, "127.0.0.1:") {
		t.Fatalf("runner listens on %q, want 127.0.0.1:PORT", r.addr)
	}
	return r
}

type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// supportTicketVia is the shipped support-ticket pipeline with the draft stage routed to addr.
func supportTicketVia(t *testing.T, addr string) *pipeline.Pipeline {
	t.Helper()
	src, err := fs.ReadFile(pipelines.FS, "support-ticket.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const draft = "  - name: draft\n"
	if strings.Count(string(src), draft) != 1 {
		t.Fatalf("support-ticket.yaml: want one %q line", strings.TrimSpace(draft))
	}
	src = []byte(strings.Replace(string(src), draft, draft+"    runner: "+addr+"\n", 1))
	p, problems, err := pipeline.Parse("support-ticket.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	if pipeline.HasErrors(problems) {
		t.Fatalf("support-ticket.yaml with a runner: line does not pass lint: %v", problems)
	}
	if st, _, ok := p.Stage("draft"); !ok || st.Runner != addr {
		t.Fatalf("draft stage runner = %+v, want %s", st, addr)
	}
	return p
}

// tsOperatorToken is the operator token the TypeScript client reads its job with.
const tsOperatorToken = "ts-client-operator-token"

func TestTypeScriptDrafter(t *testing.T) {
	node := requireNode(t)
	start := time.Now()

	// The TypeScript must also type-check (tsx runs it without checking); in the background.
	typecheck := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "--noEmit", "-p", ".").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v\n%s", err, out)
		}
		typecheck <- err
	}()

	dataDir := t.TempDir()
	arts := filepath.Join(dataDir, "artifacts")
	ts := startRunner(t, node, arts)
	t.Logf("TypeScript runner on %s after %s", ts.addr, time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Config{
		DataDir:         dataDir,
		CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: map[string]*pipeline.Pipeline{"support-ticket": supportTicketVia(t, ts.addr)},
		// No draft agent on the Go runner: only the Node process can serve the draft stage.
		Agents:        []agentrunner.Agent{support.NewIntake(), support.NewRetrieve(), support.NewJudge()},
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		OperatorToken: tsOperatorToken,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, ok := st.Runner.Agents()["draft"]; ok {
		t.Fatal("the Go runner has a draft agent; the test could not tell who served the stage")
	}
	coordCC, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	coord := handoffv1.NewCoordinatorServiceClient(coordCC)

	t.Run("job end to end with draft served by node", func(t *testing.T) {
		const jobID = "tkt_ts_e2e"
		input, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: jobID, Stage: "submit", Type: support.TypeRawTicket, SchemaVersion: support.SchemaRawTicket, MediaType: support.MediaJSON}, support.SampleTicket())
		if err != nil {
			t.Fatal(err)
		}
		resp, err := coord.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
			RequestId: "agentts-e2e", JobId: jobID, Pipeline: "support-ticket", Goal: demo.Goal, Constraints: demo.Constraints,
			Budget: &handoffv1.Budget{UsdRemainingMicros: 1_200_000}, Inputs: []*handoffv1.Artifact{input}, MemoryRefs: []string{"customer_id:cus_9"},
		})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := demo.Watch(ctx, coord, resp.GetJob().GetRunId(), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := coord.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		job := got.GetJob()
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || job.GetReceipt().GetExternalId() == "" {
			t.Fatalf("run ended %s (escalation %v), receipt %v; want COMPLETED with a receipt", job.GetState(), job.GetEscalation(), job.GetReceipt())
		}

		var draftAcks, verdicts []string
		var drafts []*handoffv1.StageResult
		// What each draft package carried besides the artifacts: its open questions and the
		// judge's evaluator, read from the package its PACKAGE_SENT event kept (for the Go
		// drafter to redo the draft).
		type carried struct {
			open []string
			ev   *handoffv1.Evaluator
		}
		var draftIn []carried
		for _, ev := range evs {
			if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT && ev.GetStage() == "draft" {
				draftIn = append(draftIn, carried{ev.GetPackage().GetOpenQuestions(), ev.GetPackage().GetEvaluator()})
			}
			switch {
			case ev.GetStage() == "draft" && ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK:
				draftAcks = append(draftAcks, ev.GetAck().GetStatus().String())
			case ev.GetStage() == "draft" && ev.GetKind() == handoffv1.EventKind_EVENT_KIND_STAGE_RESULT:
				drafts = append(drafts, ev.GetResult())
			case ev.GetKind() == handoffv1.EventKind_EVENT_KIND_VERDICT:
				v := ev.GetEvaluator().GetLastVerdict().String()
				for _, f := range ev.GetEvaluator().GetFailures() {
					v += " " + f.GetCode()
				}
				verdicts = append(verdicts, v)
			}
		}
		if want := []string{"ACK_STATUS_ACCEPTED", "ACK_STATUS_ACCEPTED"}; !slices.Equal(draftAcks, want) {
			t.Errorf("draft acks = %v, want %v (first draft, then its revision)", draftAcks, want)
		}
		if want := []string{"VERDICT_FAIL citation_missing", "VERDICT_PASS"}; !slices.Equal(verdicts, want) {
			t.Errorf("verdicts = %v, want %v", verdicts, want)
		}
		if len(drafts) != 2 {
			t.Fatalf("draft results = %d, want 2", len(drafts))
		}
		for i, res := range drafts {
			if res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED || len(res.GetArtifacts()) != 1 {
				t.Fatalf("draft %d: %v", i, res)
			}
			a := res.GetArtifacts()[0]
			if a.GetType() != support.TypeSummary || a.GetSchemaVersion() != support.SchemaSummary || res.GetSpentUsdMicros() != support.SpendDraft {
				t.Errorf("draft %d: artifact %s/%s spent %d, want summary_md/summary_md.v1 spent %d", i, a.GetType(), a.GetSchemaVersion(), res.GetSpentUsdMicros(), support.SpendDraft)
			}
			if tid := traceparent.TraceID(res.GetTraceparent()); tid == "" || tid != traceparent.TraceID(job.GetTraceparent()) {
				t.Errorf("draft %d: traceparent %q is not in the job's trace %q", i, res.GetTraceparent(), job.GetTraceparent())
			}
			// Written where the Go file store would have put it, with a digest that matches.
			u, err := url.Parse(a.GetUri())
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(arts, jobID, fmt.Sprintf("draft-r%d", i), "summary_md.md")
			if u.Scheme != "file" || filepath.Clean(u.Path) != want {
				t.Errorf("draft %d: uri %s, want file://%s", i, a.GetUri(), want)
			}
			data, err := st.Artifacts.Get(ctx, a.GetUri())
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			if a.GetSha256() != hex.EncodeToString(sum[:]) {
				t.Errorf("draft %d: sha256 %s does not match the file", i, a.GetSha256())
			}
			for _, k := range []string{"[hc-", "# Triage summary: ticket T-1042"} {
				if !bytes.Contains(data, []byte(k)) {
					t.Errorf("draft %d lacks %q:\n%s", i, k, data)
				}
			}

			// The port is faithful: the Go drafter, given the same package, writes the same
			// summary byte for byte, with the same hint and open questions.
			if len(draftIn) != 2 {
				t.Fatalf("draft packages sent = %d, want 2", len(draftIn))
			}
			var inputs []*handoffv1.Artifact
			for _, a := range job.GetArtifacts() {
				if a.GetType() == support.TypeIntake || a.GetType() == support.TypeChunks {
					inputs = append(inputs, a)
				}
			}
			pkg := &handoffv1.HandoffPackage{
				Schema: "handoff.v1", JobId: jobID, Stage: "draft", Goal: demo.Goal, Constraints: demo.Constraints,
				Artifacts: inputs, OpenQuestions: draftIn[i].open, Evaluator: draftIn[i].ev,
			}
			goStore, err := artifact.NewFiles(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			goRes, err := support.NewDraft().Run(ctx, agentrunner.Input{Package: pkg, Round: draftIn[i].ev.GetRounds(), Artifacts: readFrom{st.Artifacts, goStore}})
			if err != nil {
				t.Fatalf("Go drafter on draft %d's package: %v", i, err)
			}
			goData, err := goStore.Get(ctx, goRes.GetArtifacts()[0].GetUri())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(goData, data) {
				t.Errorf("draft %d differs from the Go drafter's\n--- node\n%s\n--- go\n%s", i, data, goData)
			}
			if goRes.GetNextHint() != res.GetNextHint() || !slices.Equal(goRes.GetOpenQuestions(), res.GetOpenQuestions()) {
				t.Errorf("draft %d: hint %q open %q; the Go drafter's: %q %q", i, res.GetNextHint(), res.GetOpenQuestions(), goRes.GetNextHint(), goRes.GetOpenQuestions())
			}
		}

		// The Node runner's own record: two deliveries of this job's draft, both run by it.
		if n := ts.count(2, map[string]any{"rpc": "Deliver", "job_id": jobID, "ack": "ACCEPTED"}); n != 2 {
			t.Errorf("node runner accepted %d draft deliveries for %s, want 2: %v", n, jobID, ts.records())
		}
		if n := ts.count(2, map[string]any{"rpc": "Deliver", "event": "result", "job_id": jobID, "status": "COMPLETED"}); n != 2 {
			t.Errorf("node runner completed %d drafts for %s, want 2", n, jobID)
		}
		if n := ts.count(1, map[string]any{"rpc": "Deliver", "event": "result", "job_id": jobID, "revising": true}); n != 1 {
			t.Errorf("node runner revised %d times, want once", n)
		}
	})

	t.Run("check parity with the Go runner", func(t *testing.T) {
		tsCC, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer tsCC.Close()
		goCC, err := st.Dial(st.RunnerAddr)
		if err != nil {
			t.Fatal(err)
		}
		tsRunner, goRunner := handoffv1.NewAgentRunnerServiceClient(tsCC), handoffv1.NewAgentRunnerServiceClient(goCC)

		cases := []struct {
			name   string
			edit   func(p map[string]any)
			status handoffv1.AckStatus
			must   []string // field|rule pairs both must name
		}{
			{"job_id removed, bad artifact uri", func(p map[string]any) {
				delete(p, "job_id")
				art(p)["uri"] = "::not a uri"
			}, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"job_id|required", "artifacts[0].uri|string.uri"}},
			{"cel rules and patterns", func(p map[string]any) {
				p["trace"].(map[string]any)["traceparent"] = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
				p["tools_tried"].([]any)[0].(map[string]any)["error_code"] = "timeout"
				p["memory_refs"] = []any{"Customer:cus 9"}
				p["open_questions"] = []any{""}
				p["evaluator"] = map[string]any{"last_verdict": "VERDICT_FAIL", "rounds": 1}
				p["budget"].(map[string]any)["usd_remaining_micros"] = "-5"
				p["stage"] = "Draft"
				art(p)["sha256"] = "ABC"
			}, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"trace.traceparent|traceparent.nonzero", "tools_tried[0]|tool_attempt.error_code", "evaluator|evaluator.failures"}},
			{"no schema", func(p map[string]any) { delete(p, "schema") }, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"schema|required"}},
			{"unknown version", func(p map[string]any) { p["schema"] = "handoff.v9"; delete(p, "job_id") }, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"schema|version.accepted"}},
			{"stage no runner serves", func(p map[string]any) { p["stage"] = "translate" }, handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"stage|role.agent"}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				pkg := packageFrom(t, c.edit)
				acks := map[string]*handoffv1.Ack{}
				for name, r := range map[string]handoffv1.AgentRunnerServiceClient{"go": goRunner, "ts": tsRunner} {
					resp, err := r.Check(ctx, &handoffv1.CheckRequest{Package: pkg})
					if err != nil {
						t.Fatalf("%s runner Check: %v", name, err)
					}
					acks[name] = resp.GetAck()
				}
				goSet, tsSet := reasonSet(acks["go"]), reasonSet(acks["ts"])
				if acks["go"].GetStatus() != c.status || acks["ts"].GetStatus() != c.status {
					t.Fatalf("status go %s, ts %s; want %s", acks["go"].GetStatus(), acks["ts"].GetStatus(), c.status)
				}
				if !slices.Equal(goSet, tsSet) {
					t.Errorf("reasons differ (field|rule)\n go: %v\n ts: %v", goSet, tsSet)
				}
				for _, m := range c.must {
					if !slices.Contains(tsSet, m) {
						t.Errorf("reasons %v lack %s", tsSet, m)
					}
				}
				if g, s := acks["go"], acks["ts"]; g.GetJobId() != s.GetJobId() || g.GetStage() != s.GetStage() || g.GetSchema() != s.GetSchema() || g.GetTraceparent() != s.GetTraceparent() {
					t.Errorf("ack identity differs: go %q/%q/%q/%q, ts %q/%q/%q/%q", g.GetJobId(), g.GetStage(), g.GetSchema(), g.GetTraceparent(), s.GetJobId(), s.GetStage(), s.GetSchema(), s.GetTraceparent())
				}
				msgs := func(a *handoffv1.Ack) map[string]string {
					m := map[string]string{}
					for _, r := range a.GetReasons() {
						m[r.GetField()+"|"+r.GetRule()] = r.GetMessage()
					}
					return m
				}
				gm, sm := msgs(acks["go"]), msgs(acks["ts"])
				for k, v := range gm {
					if sm[k] != v {
						t.Logf("message for %s differs: go %q, ts %q", k, v, sm[k])
					}
				}
			})
		}

		// Deliver answers a broken package with the Ack alone: first message, then the end.
		stream, err := tsRunner.Deliver(ctx, &handoffv1.DeliverRequest{Package: packageFrom(t, cases[0].edit), Agent: "draft"})
		if err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil || first.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
			t.Fatalf("Deliver first message %v, %v; want a REJECTED_SCHEMA ack", first, err)
		}
		if msg, err := stream.Recv(); err != io.EOF {
			t.Fatalf("Deliver after a rejection sent %v, %v; want the end of the stream", msg, err)
		}
	})

	t.Run("typescript client submits and watches to COMPLETED", func(t *testing.T) {
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		cmd := exec.CommandContext(cctx, node, "--import", "tsx", "src/client.ts",
			"--coordinator", st.CoordinatorAddr, "--artifacts", arts, "--job-id", "tkt_ts_client", "--token", tsOperatorToken)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client: %v\n%s", err, out)
		}
		for _, want := range []string{"SUBMITTED", "FAIL citation_missing", "PASS", "RECEIPT", " COMPLETED  receipt "} {
			if !strings.Contains(string(out), want) {
				t.Errorf("client output lacks %q:\n%s", want, out)
			}
		}
		if n := ts.count(2, map[string]any{"rpc": "Deliver", "event": "result", "job_id": "tkt_ts_client", "status": "COMPLETED"}); n != 2 {
			t.Errorf("node runner completed %d drafts for the client's job, want 2", n)
		}
		t.Logf("client output:\n%s", out)
	})

	t.Run("a stage a person sent the job back to is not a DUPLICATE", func(t *testing.T) {
		tsCC, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer tsCC.Close()
		tsRunner := handoffv1.NewAgentRunnerServiceClient(tsCC)
		// The client's job completed its first draft (round 0) on the node runner.
		for returns, want := range map[uint32]handoffv1.AckStatus{0: handoffv1.AckStatus_ACK_STATUS_DUPLICATE, 1: handoffv1.AckStatus_ACK_STATUS_ACCEPTED} {
			pkg := packageFrom(t, func(m map[string]any) {
				m["job_id"], m["stage"], m["operator_returns"] = "tkt_ts_client", "draft", returns
				delete(m, "evaluator")
				delete(m, "visit") // the first visit: the fixture's visit names a later one
			})
			resp, err := tsRunner.Check(ctx, &handoffv1.CheckRequest{Package: pkg})
			if err != nil || resp.GetAck().GetStatus() != want {
				t.Errorf("Check of the first draft with operator_returns %d = %v, %v; want %s", returns, resp.GetAck().GetStatus(), err, want)
			}
		}
	})

	t.Run("a handoff.v2 package is refused naming its version", func(t *testing.T) {
		tsCC, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer tsCC.Close()
		p2, err := contract.V1ToV2(packageFrom(t, func(map[string]any) {}), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := handoffv1.NewAgentRunnerServiceClient(tsCC).Check(ctx, &handoffv1.CheckRequest{PackageV2: p2})
		r := resp.GetAck().GetReasons()
		if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || len(r) != 1 ||
			r[0].GetRule() != contract.RuleVersionAccepted || !strings.Contains(r[0].GetMessage(), `"handoff.v2"`) {
			t.Fatalf("Check of a v2 package = %v, %v; want REJECTED_SCHEMA naming handoff.v2", resp.GetAck(), err)
		}
	})

	if err := <-typecheck; err != nil {
		t.Errorf("tsc --noEmit: %v", err)
	}
	t.Logf("total %s", time.Since(start).Round(time.Millisecond))
}

// packageFrom is testdata/packages/valid.json after edit.
func packageFrom(t *testing.T, edit func(map[string]any)) *handoffv1.HandoffPackage {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "packages", "valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	p := &handoffv1.HandoffPackage{}
	if err := protojson.Unmarshal(data, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// readFrom reads artifacts from one store and writes them to another.
type readFrom struct {
	from artifact.Store
	to   artifact.Store
}

func (r readFrom) Get(ctx context.Context, uri string) ([]byte, error) { return r.from.Get(ctx, uri) }
func (r readFrom) Put(ctx context.Context, ref artifact.Ref, data []byte) (*handoffv1.Artifact, error) {
	return r.to.Put(ctx, ref, data)
}

func art(p map[string]any) map[string]any { return p["artifacts"].([]any)[0].(map[string]any) }

// reasonSet is an ack's reasons as sorted "field|rule" strings.
func reasonSet(a *handoffv1.Ack) []string {
	var out []string
	for _, r := range a.GetReasons() {
		out = append(out, r.GetField()+"|"+r.GetRule())
	}
	sort.Strings(out)
	return out
}
