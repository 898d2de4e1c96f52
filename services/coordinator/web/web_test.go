package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner/support"
	"github.com/handoffhq/handoff/services/coordinator/web"
)

// page starts the stack with its operator page and returns the page's base URL.
func page(t *testing.T) (*stack.Stack, string) {
	t.Helper()
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0",
		WritebackAddr: "127.0.0.1:0", WebAddr: "127.0.0.1:0", OperatorToken: token, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, "http://" + st.WebAddr
}

// pageWithAccounts is page with operator accounts, each "name role token" (the token is
// stored only as its hash, as in an accounts file).
func pageWithAccounts(t *testing.T, accounts ...string) (*stack.Stack, string) {
	t.Helper()
	var lines []string
	for _, a := range accounts {
		f := strings.Fields(a)
		h := sha256.Sum256([]byte(f[2]))
		lines = append(lines, f[0]+" "+f[1]+" "+hex.EncodeToString(h[:]))
	}
	accs, err := identity.ParseAccounts("test", strings.Join(lines, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0",
		WritebackAddr: "127.0.0.1:0", WebAddr: "127.0.0.1:0", Operators: accs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, "http://" + st.WebAddr
}

// browser is an HTTP client with a cookie jar that does not follow redirects, so each
// answer can be read as the browser gets it.
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestSignInRedirectsOnlyToThisSite(t *testing.T) {
	_, base := page(t)
	for _, tc := range []struct{ next, want string }{
		{"/jobs/run_1", "/jobs/run_1"},
		{"/?x=1", "/?x=1"},
		{"/\\evil.com", "/"},
		{"/%5Cevil.com", "/"},
		{"//evil.com", "/"},
		{"/%2F%2Fevil.com", "/"},
		{"https://evil.com/", "/"},
		{"javascript:alert(1)", "/"},
		{"/\tevil", "/"},
		{"", "/"},
	} {
		resp, _ := post(t, browser(t), base+"/login", url.Values{"token": {token}, "next": {tc.next}})
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != tc.want {
			t.Errorf("next %q: %d Location %q, want 303 %q", tc.next, resp.StatusCode, resp.Header.Get("Location"), tc.want)
		}
	}
}

func TestSessionIsSignedExpiresAndEndsAtSignOut(t *testing.T) {
	_, base := page(t)
	c := browser(t)
	if resp, _ := get(t, c, base+"/"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("queue before sign-in: %d, want 401", resp.StatusCode)
	}
	resp, _ := post(t, c, base+"/login", url.Values{"token": {token}, "next": {"/"}})
	var sess *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == web.CookieName {
			sess = ck
		}
	}
	if sess == nil {
		t.Fatalf("no %s cookie after sign-in: %v", web.CookieName, resp.Cookies())
	}
	if strings.Contains(sess.Value, token) || !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.MaxAge <= 0 || sess.MaxAge > int(web.DefaultSessionTTL.Seconds()) {
		t.Fatalf("session cookie %+v: want signed (no token), HttpOnly, SameSite=Strict, with an expiry", sess)
	}
	if resp, body := get(t, c, base+"/"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Escalated jobs") {
		t.Fatalf("queue after sign-in: %d", resp.StatusCode)
	}
	// A forged or altered session is no session.
	forged := browser(t)
	u, _ := url.Parse(base)
	parts := strings.Split(sess.Value, ".")
	parts[1] = "99999999999"
	forged.Jar.SetCookies(u, []*http.Cookie{{Name: web.CookieName, Value: strings.Join(parts, ".")}})
	if resp, _ := get(t, forged, base+"/"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("altered session: %d, want 401", resp.StatusCode)
	}
	// The raw token as a cookie (the old scheme) is no session either.
	old := browser(t)
	old.Jar.SetCookies(u, []*http.Cookie{{Name: web.CookieName, Value: token}, {Name: "handoff_operator", Value: token}})
	if resp, _ := get(t, old, base+"/"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("token as cookie: %d, want 401", resp.StatusCode)
	}
	// Sign-out ends the session on the server, not only in this browser.
	if resp, _ := post(t, c, base+"/logout", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", resp.StatusCode)
	}
	replay := browser(t)
	replay.Jar.SetCookies(u, []*http.Cookie{{Name: web.CookieName, Value: sess.Value}})
	if resp, _ := get(t, replay, base+"/"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("session replayed after sign-out: %d, want 401", resp.StatusCode)
	}
}

func TestFailedSignInsAreLimited(t *testing.T) {
	_, base := page(t)
	var last *http.Response
	for range 6 {
		last, _ = post(t, browser(t), base+"/login", url.Values{"token": {"wrong-wrong-wrong-wrong"}})
	}
	if last.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("6th failed sign-in: %d, want 429", last.StatusCode)
	}
	resp, body := post(t, browser(t), base+"/login", url.Values{"token": {token}})
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "too many failed") {
		t.Fatalf("right token right after: %d, want 429 until the allowance refills", resp.StatusCode)
	}
}

// A decision names its escalation: a form without one is refused before the coordinator
// is called, and one for another escalation is refused by the coordinator.
func TestResolveNamesTheEscalation(t *testing.T) {
	st, base := page(t)
	job := escalated(t, st)
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	form := url.Values{"action": {"fail"}, "operator": {"ana"}, "reason": {"no"}}
	if resp, body := post(t, c, base+"/jobs/"+job.GetRunId()+"/resolve", form); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "escalation") {
		t.Fatalf("no escalation: %d %s", resp.StatusCode, body)
	}
	form.Set("escalation", "2")
	if resp, body := post(t, c, base+"/jobs/"+job.GetRunId()+"/resolve", form); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "escalation 1") {
		t.Fatalf("stale escalation: %d %s", resp.StatusCode, body)
	}
	got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil || got.GetJob().GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("after refused decisions: %v %v", got.GetJob().GetState(), err)
	}
}

// Form text that is not UTF-8 is refused naming the field, before anything is decided.
func TestResolveRefusesInvalidUTF8(t *testing.T) {
	st, base := page(t)
	job := escalated(t, st)
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	resp, body := post(t, c, base+"/jobs/"+job.GetRunId()+"/resolve", url.Values{"action": {"fail"}, "comment": {"\xff\xfe"}, "reason": {"no"}, "escalation": {"1"}})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "comment: invalid UTF-8") {
		t.Fatalf("invalid UTF-8 comment: %d %s", resp.StatusCode, body)
	}
	got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil || got.GetJob().GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || got.GetJob().GetResolution() != nil {
		t.Fatalf("after the refused form: %v %v", got.GetJob(), err)
	}
}

// TestJobPageShowsTheRoute: the operator page of a run shows the route it took, hop by hop,
// with the stage's reason and priority: here support-triage's intake handing an unclear
// ticket to a person.
func TestJobPageShowsTheRoute(t *testing.T) {
	st, base := page(t)
	ctx := context.Background()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	data, err := support.Ticket("unclear")
	if err != nil {
		t.Fatal(err)
	}
	in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_3015", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, data)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_3015", Pipeline: "support-triage", Goal: "Draft internal triage summary",
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{in}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := demo.Watch(ctx, client, resp.GetJob().GetRunId(), nil); err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	r, body := get(t, c, base+"/jobs/"+resp.GetJob().GetRunId())
	if r.StatusCode != http.StatusOK {
		t.Fatalf("job page: %d %s", r.StatusCode, body)
	}
	for _, want := range []string{`<table id="route">`, "<td>intake</td><td><code>unclear</code></td><td>escalate</td>", "neither a billing nor a technical ticket", "<td>NORMAL</td>", "ROUTED",
		// The hop explained: five answers, with the artifact it read as evidence.
		`<table id="explanation">`, `<td>1</td><td>intake</td><td>SAME_JOB</td><td class="ok">OK</td>`, "<td>ARTIFACTS_READ</td>",
		"<code>result.artifacts_read</code> <code>" + in.GetUri() + "</code> (read, given)", `<p id="violations" class="ok">`} {
		if !strings.Contains(body, want) {
			t.Errorf("job page lacks %q:\n%s", want, body)
		}
	}
}

// TestJobPageShowsBranchesAndSubJobs: a research-brief job's page shows its two branches
// side by side (status, stage, hops, start and end) and its sub-job with the artifact it
// returned, linked to the nested run's page, which names its parent.
func TestJobPageShowsBranchesAndSubJobs(t *testing.T) {
	st, base := page(t)
	ctx := context.Background()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_7", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_7", Pipeline: "research-brief", Goal: "Draft internal triage summary",
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{in}})
	if err != nil {
		t.Fatal(err)
	}
	runID := resp.GetJob().GetRunId()
	if _, err := demo.Watch(ctx, client, runID, nil); err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	r, body := get(t, c, base+"/jobs/"+runID)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("job page: %d %s", r.StatusCode, body)
	}
	for _, want := range []string{`<table id="branches">`, "<th>lookups / policy</th><th>lookups / history</th>",
		"<tr><th>Status</th><td>COMPLETED</td><td>COMPLETED</td></tr>", "<tr><th>Stage</th><td>policy-lookup</td><td>history-lookup</td></tr>",
		`<table id="children">`, `<a href="/jobs/` + runID + `-draft-0">`, "<td>support-ticket</td><td>COMPLETED</td>", "<code>summary_md.v1</code>"} {
		if !strings.Contains(body, want) {
			t.Errorf("job page lacks %q:\n%s", want, body)
		}
	}
	_, body = get(t, c, base+"/jobs/"+runID+"-draft-0")
	if !strings.Contains(body, `<p id="parent">A sub-job of run <a href="/jobs/`+runID+`">`) {
		t.Errorf("the sub-job's page does not name its parent:\n%s", body)
	}
}

// submitBare sends the README's submit recipe: a support-ticket job without its input
// ticket, which intake escalates.
func submitBare(t *testing.T, st *stack.Stack, jobID string) *handoffv1.Job {
	t.Helper()
	ctx := context.Background()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{RequestId: "readme-" + jobID, JobId: jobID, Pipeline: "support-ticket", Goal: "Draft internal triage summary",
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}})
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
	if j := got.GetJob(); j.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || j.GetStage() != "intake" {
		t.Fatalf("run %s at %s, want ESCALATED at intake", j.GetState(), j.GetStage())
	}
	return got.GetJob()
}

// TestApproveNotOfferedWithoutArtifact: a run escalated at intake has no artifact for the
// writeback to write, so the page offers no Approve and says why; a forged approve is
// refused naming the missing artifact and records nothing; and after a decision the page
// says what the run is now, not "Done".
func TestApproveNotOfferedWithoutArtifact(t *testing.T) {
	st, base := page(t)
	job := submitBare(t, st, "tkt_42")
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	u := base + "/jobs/" + job.GetRunId()
	_, body := get(t, c, u)
	if strings.Contains(body, `id="approve"`) || !strings.Contains(body, `id="no-approve"`) || !strings.Contains(body, "no summary_md.v1 artifact") {
		t.Fatalf("job page of an intake escalation offers approve or does not say why:\n%s", body)
	}
	resp, body := post(t, c, u+"/resolve", url.Values{"action": {"approve"}, "operator": {"ana"}, "escalation": {"1"}})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "no summary_md.v1 artifact") {
		t.Fatalf("forged approve: %d %s", resp.StatusCode, body)
	}
	got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil || got.GetJob().GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || got.GetJob().GetResolution() != nil {
		t.Fatalf("after the refused approve: %v %v", got.GetJob(), err)
	}
	resp, _ = post(t, c, u+"/resolve", url.Values{"action": {"fail"}, "operator": {"ana"}, "reason": {"no ticket"}, "escalation": {"1"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("fail: %d", resp.StatusCode)
	}
	_, body = get(t, c, base+resp.Header.Get("Location"))
	if strings.Contains(body, "Done:") || !strings.Contains(body, `<span id="outcome">FAILED</span>`) {
		t.Fatalf("page after fail does not show the resulting state:\n%s", body)
	}
}

// TestReturnWithGrantFromThePage: a HOP_CAP escalation returned without hops is refused
// with the reason; returned with a grant of 4 hops it completes, and the page shows the
// grant with the account that gave it.
func TestReturnWithGrantFromThePage(t *testing.T) {
	st, base := page(t)
	job := escalated(t, st)
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	u := base + "/jobs/" + job.GetRunId()
	if _, body := get(t, c, u); !strings.Contains(body, `id="grant_hops"`) || !strings.Contains(body, "at most 12 hops") {
		t.Fatalf("job page offers no grant with the return:\n%s", body)
	}
	form := url.Values{"action": {"return_to_stage"}, "stage": {"draft"}, "operator": {"ana"}, "escalation": {"1"}}
	if resp, body := post(t, c, u+"/resolve", form); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "no hops left") {
		t.Fatalf("return without a grant: %d %s", resp.StatusCode, body)
	}
	form.Set("grant_hops", "x")
	if resp, body := post(t, c, u+"/resolve", form); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "grant_hops") {
		t.Fatalf("grant_hops=x: %d %s", resp.StatusCode, body)
	}
	form.Set("grant_hops", "4")
	if resp, body := post(t, c, u+"/resolve", form); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("return with 4 hops: %d %s", resp.StatusCode, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetJob().GetState() == handoffv1.JobState_JOB_STATE_COMPLETED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s after the granted return, want COMPLETED (%v)", got.GetJob().GetState(), got.GetJob().GetEscalation())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, body := get(t, c, u)
	if !strings.Contains(body, `<table id="timeline">`) || !strings.Contains(body, "<b>RETURN_TO_STAGE</b> by operator, granted 4 hops, 0 revisions, $0.00") {
		t.Fatalf("the job page's timeline lacks the grant with the account:\n%s", body)
	}
	if !strings.Contains(body, `<dd id="grant">4 hops, 0 revisions, $0.00 by operator</dd>`) || !strings.Contains(body, `<span id="state">COMPLETED</span>`) {
		t.Fatalf("page after the granted return lacks the grant or the state:\n%s", body)
	}
}

// TestOperatorsAreNamedPeopleWithRoles: accounts with hashed tokens sign in as themselves;
// a viewer reads the job but is offered no decision and is refused one; a resolver's
// decision records the account it signed in as, with no name to type.
func TestOperatorsAreNamedPeopleWithRoles(t *testing.T) {
	viewerTok, resolverTok := "bo-viewer-token-0123456789", "ana-resolver-token-0123456789"
	st, base := pageWithAccounts(t, "ana resolver "+resolverTok, "bo viewer "+viewerTok)
	job := escalated(t, st)
	u := base + "/jobs/" + job.GetRunId()
	form := url.Values{"action": {"fail"}, "reason": {"duplicate ticket"}, "escalation": {"1"}}

	bo := browser(t)
	post(t, bo, base+"/login", url.Values{"token": {viewerTok}})
	if r, body := get(t, bo, base+"/"); r.StatusCode != http.StatusOK || !strings.Contains(body, "tkt_web") {
		t.Fatalf("viewer's queue: %d %s", r.StatusCode, body)
	}
	_, body := get(t, bo, u)
	if strings.Contains(body, `id="resolve"`) || !strings.Contains(body, "bo, a viewer") {
		t.Fatalf("viewer's job page offers decisions or does not say why not:\n%s", body)
	}
	if r, body := post(t, bo, u+"/resolve", form); r.StatusCode != http.StatusForbidden || !strings.Contains(body, "viewer") {
		t.Fatalf("viewer's decision: %d %s; want 403 naming the role", r.StatusCode, body)
	}

	ana := browser(t)
	post(t, ana, base+"/login", url.Values{"token": {resolverTok}})
	if _, body := get(t, ana, u); !strings.Contains(body, `id="resolve"`) || strings.Contains(body, `name="operator"`) || !strings.Contains(body, `<b id="me">ana</b>`) {
		t.Fatalf("resolver's job page: want the decision form, deciding as ana, no name box:\n%s", body)
	}
	if r, body := post(t, ana, u+"/resolve", form); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolver's decision: %d %s", r.StatusCode, body)
	}
	got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if res := got.GetJob().GetResolution(); res.GetAccount() != "ana" || res.GetOperator() != "ana" {
		t.Fatalf("resolution %v; want it recorded as account ana", res)
	}
}

// waitJob polls the run until it is in state want.
func waitJob(t *testing.T, st *stack.Stack, runID string, want handoffv1.JobState) *handoffv1.Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := st.Coordinator.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetJob().GetState() == want {
			return got.GetJob()
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s, want %s (%v)", runID, got.GetJob().GetState(), want, got.GetJob().GetEscalation())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The README's submit recipe sends no ticket and intake escalates: the person returns the
// job to intake with the ticket pasted in, stored as intake's raw_ticket.v1, and the job
// completes.
func TestReturnToIntakeWithTicket(t *testing.T) {
	st, base := page(t)
	job := submitBare(t, st, "tkt_42")
	c := browser(t)
	post(t, c, base+"/login", url.Values{"token": {token}})
	u := base + "/jobs/" + job.GetRunId()
	if _, body := get(t, c, u); !strings.Contains(body, `id="artifact_text"`) {
		t.Fatalf("no box for the input of a return:\n%s", body)
	}
	resp, body := post(t, c, u+"/resolve", url.Values{"action": {"return_to_stage"}, "stage": {"intake"}, "escalation": {"1"},
		"artifact_text": {string(support.SampleTicket())}, "original_text": {""}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("return to intake with a ticket: %d %s", resp.StatusCode, body)
	}
	done := waitJob(t, st, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	var in *handoffv1.Artifact
	for _, a := range done.GetArtifacts() {
		if a.GetProducedBy() == "operator" {
			in = a
		}
	}
	if in.GetSchemaVersion() != "raw_ticket.v1" || in.GetType() != "raw_ticket" || in.GetMediaType() != "application/json" || done.GetReceipt() == nil {
		t.Fatalf("operator's input %v, receipt %v; want a raw_ticket.v1 JSON and a write", in, done.GetReceipt())
	}
}

// On the page: a resolver claims the escalation, the queue and the job page show who holds
// it, another resolver's decision is refused unless they override, and the override shows.
func TestClaimOnThePage(t *testing.T) {
	anaTok, cyTok := "ana-resolver-token-0123456789", "cy-resolver-token-0123456789"
	st, base := pageWithAccounts(t, "ana resolver "+anaTok, "cy resolver "+cyTok)
	job := escalated(t, st)
	u := base + "/jobs/" + job.GetRunId()
	ana, cy := browser(t), browser(t)
	post(t, ana, base+"/login", url.Values{"token": {anaTok}})
	post(t, cy, base+"/login", url.Values{"token": {cyTok}})
	if r, body := post(t, ana, u+"/claim", url.Values{"escalation": {"1"}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("claim: %d %s", r.StatusCode, body)
	}
	if _, body := get(t, cy, base+"/"); !strings.Contains(body, "<td>ana <small") {
		t.Fatalf("queue does not show the holder:\n%s", body)
	}
	if _, body := get(t, cy, u); !strings.Contains(body, `<b id="holder">ana</b>`) || !strings.Contains(body, `id="override"`) || strings.Contains(body, `id="claim-it"`) {
		t.Fatalf("job page for another resolver: want the holder and an override box, no claim button:\n%s", body)
	}
	form := url.Values{"action": {"fail"}, "reason": {"duplicate"}, "escalation": {"1"}}
	if r, body := post(t, cy, u+"/claim", url.Values{"escalation": {"1"}}); r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "claimed by ana") {
		t.Fatalf("claim of a held escalation: %d %s", r.StatusCode, body)
	}
	if r, body := post(t, cy, u+"/resolve", form); r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "claimed by ana") {
		t.Fatalf("decision without override: %d %s", r.StatusCode, body)
	}
	form.Set("override", "1")
	if r, body := post(t, cy, u+"/resolve", form); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("decision with override: %d %s", r.StatusCode, body)
	}
	if _, body := get(t, cy, u); !strings.Contains(body, `<dd id="overrode">the claim of ana</dd>`) {
		t.Fatalf("page does not show the override:\n%s", body)
	}
}

// The escalation is delivered to its route's webhook: POSTed with run, job, cause and a
// link, Idempotency-Key run:escalation on every try, retried past failures; a delivery that
// never succeeds shows on the page.
func TestEscalationWebhook(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // Idempotency-Key -> bodies
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen[key] = append(seen[key], string(b))
		n := len(seen[key])
		mu.Unlock()
		if strings.Contains(string(b), "tkt_43") || n < 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	pls, err := stack.ShippedPipelines()
	if err != nil {
		t.Fatal(err)
	}
	pls["support-ticket"].Escalation.Webhook = hook.URL
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0",
		WritebackAddr: "127.0.0.1:0", WebAddr: "127.0.0.1:0", OperatorToken: token, Pipelines: pls, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	delivery := func(j *handoffv1.Job) *handoffv1.Delivery {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if d, err := st.Coordinator.Delivery(context.Background(), j); err != nil {
				t.Fatal(err)
			} else if d != nil {
				return d
			}
		}
		t.Fatalf("no delivery recorded for %s", j.GetRunId())
		return nil
	}
	ok := submitBare(t, st, "tkt_42")
	if d := delivery(ok); !d.GetDelivered() || d.GetAttempts() != 3 || d.GetStatusCode() != http.StatusNoContent {
		t.Fatalf("delivery %v; want delivered on the 3rd try", d)
	}
	key := ok.GetRunId() + ":1"
	mu.Lock()
	bodies := seen[key]
	mu.Unlock()
	if len(bodies) != 3 || bodies[0] != bodies[2] || !strings.Contains(bodies[0], `"job_id":"tkt_42"`) || !strings.Contains(bodies[0], `"cause":`) || !strings.Contains(bodies[0], `"escalation":1`) ||
		!strings.Contains(bodies[0], `"link":"http://`+st.WebAddr+`/jobs/`+ok.GetRunId()+`"`) {
		t.Fatalf("posts under Idempotency-Key %s: %q; want 3 identical bodies with run, job, cause", key, bodies)
	}
	bad := submitBare(t, st, "tkt_43")
	if d := delivery(bad); d.GetDelivered() || d.GetAttempts() != 5 || !strings.Contains(d.GetError(), "503") {
		t.Fatalf("delivery %v; want 5 failed tries", d)
	}
	c := browser(t)
	post(t, c, base(st)+"/login", url.Values{"token": {token}})
	if _, body := get(t, c, base(st)+"/jobs/"+bad.GetRunId()); !strings.Contains(body, "Escalation not delivered") || !strings.Contains(body, "5 time(s)") {
		t.Fatalf("the page does not show the failed delivery:\n%s", body)
	}
	if _, body := get(t, c, base(st)+"/jobs/"+ok.GetRunId()); !strings.Contains(body, "Escalation delivered to") {
		t.Fatalf("the page does not show the delivery:\n%s", body)
	}
}

func base(st *stack.Stack) string { return "http://" + st.WebAddr }
