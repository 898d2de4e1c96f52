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
	ctx := chrome(t)
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

// chrome starts headless Chromium for the test and returns its context. When the test
// fails, a screenshot of the page as it was is saved to TEST_OUTPUT_DIR (or the test's
// temporary folder) and its path logged.
func chrome(t *testing.T) context.Context {
	t.Helper()
	bin := chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1600)}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelC := chromedp.NewContext(actx)
	// The browser starts here, on a context without the test's deadline, so it is still
	// there to take the screenshot of a step that ran out of time.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		cancelC()
		cancelA()
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	out := os.Getenv("TEST_OUTPUT_DIR")
	if out == "" {
		out = t.TempDir()
	}
	t.Cleanup(func() {
		if t.Failed() {
			sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
			defer cancel()
			if shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)); err != nil {
				t.Logf("no screenshot of the failure: %v", err)
			} else {
				p := filepath.Join(out, strings.ReplaceAll(t.Name(), "/", "_")+"-failure.png")
				if err := os.WriteFile(p, shot, 0o644); err != nil {
					t.Logf("screenshot: %v", err)
				} else {
					t.Logf("screenshot of the failure: %s", p)
				}
			}
		}
		cancelT()
		cancelC()
		cancelA()
	})
	return ctx
}

// TestBrowserDesk works the desk as an operator does, in Chromium: sign-in, the queue, an
// intake escalation (the README's submit recipe) where Approve is not offered and a forced
// one is refused, a return to intake with the ticket that completes, a HOP_CAP escalation
// returned with a grant of 4 hops that completes with the grant on the timeline under the
// account's name, and sign-out.
func TestBrowserDesk(t *testing.T) {
	ctx := chrome(t)
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0", WebAddr: "127.0.0.1:0", OperatorToken: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	bare := submitBare(t, st, "tkt_42")
	spam := submitBare(t, st, "tkt_44")
	capped := escalated(t, st)
	base := "http://" + st.WebAddr
	c := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string) string {
		t.Helper()
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := chromedp.Run(tctx, chromedp.Text(c(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// completed reloads the job page until the run is COMPLETED.
	completed := func(runID string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; {
			do("reload", chromedp.Navigate(base+"/jobs/"+runID), chromedp.WaitVisible(c("#state")))
			if s := text("#state"); s == "COMPLETED" {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("run %s is %s, want COMPLETED", runID, s)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	do("sign in", chromedp.Navigate(base+"/"), chromedp.SendKeys(c("#token"), token), chromedp.Click(c("#login")), chromedp.WaitVisible(c("#queue")))
	if q := text("#queue"); !strings.Contains(q, "tkt_42") || !strings.Contains(q, "tkt_web") || !strings.Contains(q, "HOP_CAP") {
		t.Fatalf("queue %q: want both escalations", q)
	}

	// The intake escalation: no artifact, so no Approve; one forced onto the page is refused.
	do("open the intake escalation", chromedp.Navigate(base+"/jobs/"+bare.GetRunId()), chromedp.WaitVisible(c("#no-approve")))
	if n := text("#no-approve"); !strings.Contains(n, "no summary_md.v1 artifact") {
		t.Fatalf("no-approve note %q", n)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("approve") === null`)); err != nil {
		t.Fatal(err)
	}
	do("force an approve", chromedp.Evaluate[chromedp.Void](`(() => { const b = document.createElement("button"); b.type = "submit"; b.name = "action"; b.value = "approve"; b.id = "forced"; document.getElementById("resolve").appendChild(b); })()`),
		chromedp.Click(c("#forced")), chromedp.WaitVisible(c("#error")))
	// The error page, not the job page (whose note names the artifact too): the wait above
	// also lets the form's navigation finish before the next one starts.
	if e := text("#error"); !strings.Contains(e, "no summary_md.v1 artifact") {
		t.Fatalf("forced approve: the error page says %q; want the refusal naming the artifact", e)
	}
	do("return to intake with the ticket", chromedp.Navigate(base+"/jobs/"+bare.GetRunId()), chromedp.WaitVisible(c("#artifact_text")),
		chromedp.SetValue(c("#artifact_text"), string(support.SampleTicket())), chromedp.SetValue(c("#stage"), "intake"),
		chromedp.Click(c("#return")), chromedp.WaitVisible(c("#outcome")))
	if o := text("#outcome"); o != "RUNNING" && o != "COMPLETED" {
		t.Fatalf("after the return the page says the run is %q", o)
	}
	completed(bare.GetRunId())

	// A fail: the page says the run is FAILED, and keeps the cause beside the decision.
	do("fail", chromedp.Navigate(base+"/jobs/"+spam.GetRunId()), chromedp.WaitVisible(c("#reason")),
		chromedp.SendKeys(c("#reason"), "spam"), chromedp.Click(c("#fail")), chromedp.WaitVisible(c("#outcome")))
	if o := text("#outcome"); o != "FAILED" {
		t.Fatalf("after fail the page says %q", o)
	}

	// The HOP_CAP escalation: claimed, then returned to draft with 4 hops.
	do("claim", chromedp.Navigate(base+"/jobs/"+capped.GetRunId()), chromedp.WaitVisible(c("#claim-it")), chromedp.Click(c("#claim-it")), chromedp.WaitVisible(c("#holder")))
	if h := text("#holder"); h != "operator" {
		t.Fatalf("holder after claim %q", h)
	}
	do("queue shows the holder", chromedp.Navigate(base+"/"), chromedp.WaitVisible(c("#queue")))
	if q := text("#queue"); !strings.Contains(q, "operator until") {
		t.Fatalf("queue %q: want the holder", q)
	}
	do("return with a grant", chromedp.Navigate(base+"/jobs/"+capped.GetRunId()), chromedp.WaitVisible(c("#grant_hops")),
		chromedp.SetValue(c("#grant_hops"), "4"), chromedp.SetValue(c("#stage"), "draft"), chromedp.Click(c("#return")), chromedp.WaitVisible(c("#outcome")))
	completed(capped.GetRunId())
	if tl := text("#timeline"); !strings.Contains(tl, "RETURN_TO_STAGE by operator, granted 4 hops") {
		t.Fatalf("timeline %q: want the grant with the account", tl)
	}
	if r := text("#receipt"); !strings.Contains(r, "tkt_web:writeback:summary_md") {
		t.Fatalf("receipt %q", r)
	}

	do("sign out", chromedp.Click(c("#logout")), chromedp.WaitVisible(c("#token")))
	do("queue after sign-out", chromedp.Navigate(base+"/"), chromedp.WaitVisible(c("#token")))
}
