package web_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

const token = "browser-test-token"

func chromium(t *testing.T) string {
	for _, p := range []string{"/usr/bin/chromium", "chromium"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (apt-get install -y chromium); CI must run the browser test")
	}
	t.Skip("chromium is not installed; apt-get install -y chromium to run the browser test")
	return ""
}

// escalated runs the shipped support pipeline with a wallet of 4 hops: intake, retrieve,
// draft and judge run, and the hop cap stops the run before the writeback.
func escalated(t *testing.T, st *stack.Stack) *handoffv1.Job {
	t.Helper()
	ctx := context.Background()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_web", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_web", Pipeline: "support-ticket", Goal: "Draft internal triage summary; do not send to customer",
		Constraints: []string{"no refund promises"}, Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 4}, Inputs: []*handoffv1.Artifact{in}, MemoryRefs: []string{"customer_id:cus_9"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := demo.Watch(ctx, client, resp.GetJob().GetRunId(), nil); err != nil {
		t.Fatal(err)
	}
	got, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetJob().GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("run is %s, want ESCALATED", got.GetJob().GetState())
	}
	return got.GetJob()
}

func TestBrowserApprove(t *testing.T) {
	bin := chromium(t)
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0", WebAddr: "127.0.0.1:0", OperatorToken: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	job := escalated(t, st)
	out := os.Getenv("TEST_OUTPUT_DIR")
	if out == "" {
		out = t.TempDir()
	}

	opts := append([]chromedp.ExecAllocatorOption{},
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1600))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	base := "http://" + st.WebAddr
	var login, queue, receipt, state string
	var shot []byte
	edited := "## Triage summary\n\nEdited by a person: route to billing [hc-refund-policy].\n"
	c := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string, into *string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			v, err := chromedp.Text(c(sel))(ctx, tg)
			*into = v
			return chromedp.Void{}, err
		}
	}
	steps := []chromedp.Action[chromedp.Void]{
		chromedp.Navigate(base + "/"),
		text("h1", &login),
		chromedp.SendKeys(c("#token"), token),
		chromedp.Click(c("#login")),
		chromedp.WaitVisible(c("#queue")),
		text("#queue", &queue),
		chromedp.Click(c("a.job")),
		chromedp.WaitVisible(c("#artifact_text")),
		chromedp.SetValue(c("#artifact_text"), edited),
		chromedp.SendKeys(c("#comment"), "hop cap hit; summary is fine"),
		func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			b, err := chromedp.FullScreenshot(100)(ctx, tg)
			shot = b
			return chromedp.Void{}, err
		},
		chromedp.Click(c("#approve")),
		chromedp.WaitVisible(c("#receipt")),
		text("#receipt", &receipt),
		text("#state", &state),
	}
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "job-page.png"), shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", filepath.Join(out, "job-page.png"))
	if !strings.Contains(login, "sign-in") || !strings.Contains(queue, "tkt_web") || !strings.Contains(queue, "HOP_CAP") {
		t.Fatalf("login %q queue %q", login, queue)
	}
	if state != "COMPLETED" || !strings.Contains(receipt, "tkt_web:writeback:summary_md") {
		t.Fatalf("state %q receipt %q", state, receipt)
	}
	es, err := st.Store.LedgerEntries(context.Background())
	if err != nil || len(es) != 1 {
		t.Fatalf("ledger %d entries, %v; want 1", len(es), err)
	}
	if !strings.Contains(string(es[0].Payload), "Edited by a person") {
		t.Logf("ledger payload does not carry the text (it may hold only the uri): %.200s", es[0].Payload)
	}
	got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil || got.GetJob().GetResolution().GetOperator() != "operator" || got.GetJob().GetResolution().GetAccount() != "operator" {
		t.Fatalf("resolution %v %v", got.GetJob().GetResolution(), err)
	}
}
