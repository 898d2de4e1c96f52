package writeback_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/writeback"
)

const (
	jobID       = "tkt-4821"
	stage       = "writeback"
	artType     = "reply_md"
	traceparent = testkit.Traceparent
	wantKey     = jobID + ":" + stage + ":" + artType
)

// env is one writeback server on bufconn over a real bbolt store and a real file artifact
// store, assembled by internal/server as the binary does: every call runs the real
// interceptor chain.
type env struct {
	st     *store.Bolt
	files  *artifact.Files
	client handoffv1.WritebackServiceClient
	art    *handoffv1.Artifact // the draft artifact (round 1)
	body   []byte
}

type envOpts struct {
	targets func(st *store.Bolt) []writeback.Target // default: the ledger on the service's own store
	mod     func(o *writeback.Options)
	server  []server.Option   // e.g. the identity check (default: none)
	dial    []grpc.DialOption // e.g. per-RPC credentials
}

func newEnv(t *testing.T, eo envOpts) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "writeback.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	files, err := artifact.NewFiles(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, files: files, body: []byte("# Reply\n\nYour refund was issued on 3 May.\n")}
	e.art = e.putArtifact(t, 1, e.body)

	targets := []writeback.Target{writeback.NewLedger(st)}
	if eo.targets != nil {
		targets = eo.targets(st)
	}
	opts := writeback.Options{Store: st, Artifacts: files, Targets: targets, Logger: slog.New(slog.DiscardHandler)}
	if eo.mod != nil {
		eo.mod(&opts)
	}
	srv, err := writeback.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.client = handoffv1.NewWritebackServiceClient(testkit.Serve(t, assemble(t, srv, eo.server...), eo.dial...))
	return e
}

// assemble is srv's server as the binary assembles it, without an identity check unless
// opts give one.
func assemble(t *testing.T, srv *writeback.Server, opts ...server.Option) *server.Server {
	t.Helper()
	if len(opts) == 0 {
		opts = []server.Option{server.WithoutIdentity()}
	}
	gs, err := server.New(srv.Service(), append(opts, server.WithLogger(slog.New(slog.DiscardHandler)))...)
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

func (e *env) putArtifact(t *testing.T, round uint32, data []byte) *handoffv1.Artifact {
	t.Helper()
	a, err := e.files.Put(context.Background(), artifact.Ref{
		JobID: jobID, Stage: "draft", Round: round, Type: artType,
		SchemaVersion: "reply_md.v1", MediaType: "text/markdown",
	}, data)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// pkg is a valid writeback package carrying the judge's PASS and e.art.
func (e *env) pkg() *handoffv1.HandoffPackage {
	return testkit.Package(testkit.OfJob(jobID), testkit.AtStage(stage), testkit.Passed(), func(p *handoffv1.HandoffPackage) {
		p.Goal = "Answer the customer's refund question"
		p.Constraints = []string{"no refund promises"}
		p.Artifacts = []*handoffv1.Artifact{proto.Clone(e.art).(*handoffv1.Artifact)}
	})
}

func (e *env) req() *handoffv1.WriteRequest {
	return &handoffv1.WriteRequest{Package: e.pkg(), Artifact: proto.Clone(e.art).(*handoffv1.Artifact), Target: "ledger"}
}

func (e *env) ledger(t *testing.T) []store.LedgerEntry {
	t.Helper()
	entries, err := e.st.LedgerEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func (e *env) claimState(t *testing.T, key string) store.ClaimState {
	t.Helper()
	s, _, err := e.st.Lookup(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func badRequestFields(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				out = append(out, fv.GetField())
			}
		}
	}
	return out
}

func badRequestReasons(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				out = append(out, fv.GetReason())
			}
		}
	}
	return out
}

func TestGatesRefuseAndWriteNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	cases := []struct {
		name       string
		mut        func(r *handoffv1.WriteRequest)
		code       codes.Code
		msg        []string // substrings of the status message
		fields     []string // BadRequest field violations that must be present
		reasons    []string // BadRequest reasons that must be present
		keyClaimed string   // key that must not be claimed (default wantKey)
	}{
		{
			name: "no verdict",
			mut:  func(r *handoffv1.WriteRequest) { r.Package.Evaluator = nil },
			code: codes.FailedPrecondition,
			msg:  []string{"writeback refused: last verdict is absent; the judge must pass first"},
		},
		{
			name: "FAIL verdict",
			mut: func(r *handoffv1.WriteRequest) {
				r.Package.Evaluator = &handoffv1.Evaluator{
					LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1,
					Failures: []*handoffv1.Failure{{Code: "citation_missing"}},
				}
			},
			code: codes.FailedPrecondition,
			msg:  []string{"writeback refused: last verdict is FAIL; the judge must pass first"},
		},
		{
			name:   "artifact uri not in package",
			mut:    func(r *handoffv1.WriteRequest) { r.Artifact.Uri = "file:///elsewhere/reply.md" },
			code:   codes.InvalidArgument,
			msg:    []string{"not one of the package's artifacts"},
			fields: []string{"artifact"},
		},
		{
			name:       "artifact type not in package",
			mut:        func(r *handoffv1.WriteRequest) { r.Artifact.Type = "summary_md" },
			code:       codes.InvalidArgument,
			msg:        []string{"not one of the package's artifacts"},
			fields:     []string{"artifact"},
			keyClaimed: jobID + ":" + stage + ":summary_md",
		},
		{
			name:   "artifact sha256 differs from the package's",
			mut:    func(r *handoffv1.WriteRequest) { r.Artifact.Sha256 = strings.Repeat("0", 64) },
			code:   codes.InvalidArgument,
			msg:    []string{"sha256"},
			fields: []string{"artifact.sha256"},
		},
		{
			name:   "unknown target",
			mut:    func(r *handoffv1.WriteRequest) { r.Target = "crm" },
			code:   codes.InvalidArgument,
			msg:    []string{`unknown target "crm"`, "configured targets: ledger"},
			fields: []string{"target"},
		},
		{
			name: "invalid package names fields",
			mut: func(r *handoffv1.WriteRequest) {
				r.Package.JobId = ""
				r.Package.Budget = nil
				r.Package.Trace.Traceparent = "not-a-traceparent"
			},
			code:       codes.InvalidArgument,
			msg:        []string{"package.job_id", "package.budget", "package.trace.traceparent"},
			fields:     []string{"package.job_id", "package.budget", "package.trace.traceparent"},
			keyClaimed: ":" + stage + ":" + artType,
		},
		{
			// The validate interceptor's message lists "field: message" without the rule
			// id; the rule is the BadRequest reason.
			name:    "unaccepted package version",
			mut:     func(r *handoffv1.WriteRequest) { r.Package.Schema = "handoff.v9" },
			code:    codes.InvalidArgument,
			msg:     []string{"package.schema", "handoff.v9"},
			fields:  []string{"package.schema"},
			reasons: []string{"VERSION_ACCEPTED"},
		},
		{
			name:   "request without package, artifact, target",
			mut:    func(r *handoffv1.WriteRequest) { r.Package, r.Artifact, r.Target = nil, nil, "" },
			code:   codes.InvalidArgument,
			msg:    []string{"package:", "artifact:", "target:"},
			fields: []string{"package", "artifact", "target"},
		},
		{
			name:   "malformed request artifact",
			mut:    func(r *handoffv1.WriteRequest) { r.Artifact.SchemaVersion = "" },
			code:   codes.InvalidArgument,
			msg:    []string{"artifact.schema_version"},
			fields: []string{"artifact.schema_version"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.req()
			tc.mut(r)
			resp, err := e.client.Write(ctxT(t), r)
			if err == nil {
				t.Fatalf("Write succeeded: %v", resp)
			}
			st := status.Convert(err)
			t.Logf("%s: %s", st.Code(), st.Message())
			if st.Code() != tc.code {
				t.Fatalf("code %s, want %s (%s)", st.Code(), tc.code, st.Message())
			}
			for _, m := range tc.msg {
				if !strings.Contains(st.Message(), m) {
					t.Errorf("message %q lacks %q", st.Message(), m)
				}
			}
			got := badRequestFields(err)
			for _, f := range tc.fields {
				if !contains(got, f) {
					t.Errorf("BadRequest fields %q lack %q", got, f)
				}
			}
			gotReasons := badRequestReasons(err)
			for _, r := range tc.reasons {
				if !contains(gotReasons, r) {
					t.Errorf("BadRequest reasons %q lack %q", gotReasons, r)
				}
			}
			if n := len(e.ledger(t)); n != 0 {
				t.Errorf("ledger has %d entries, want 0", n)
			}
			key := tc.keyClaimed
			if key == "" {
				key = wantKey
			}
			if s := e.claimState(t, key); s != 0 {
				t.Errorf("key %s is %s, want untouched", key, s)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestFirstWriteThenRepeat(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t)
	first, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	rc := first.GetReceipt()
	if first.GetDuplicate() {
		t.Error("first write reported duplicate")
	}
	if rc.GetIdempotencyKey() != wantKey || rc.GetTarget() != "ledger" || rc.GetJobId() != jobID ||
		rc.GetTraceparent() != traceparent || rc.GetExternalId() == "" || rc.GetWrittenAt() == nil {
		t.Errorf("receipt %v", rc)
	}
	entries := e.ledger(t)
	if len(entries) != 1 {
		t.Fatalf("ledger has %d entries, want 1", len(entries))
	}
	if entries[0].Key != wantKey || string(entries[0].Payload) != string(e.body) || entries[0].ID != rc.GetExternalId() {
		t.Errorf("ledger entry %+v, receipt %v", entries[0], rc)
	}

	again, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	if !again.GetDuplicate() {
		t.Error("repeat not reported as duplicate")
	}
	testkit.Equal(t, again.GetReceipt(), rc, "the repeat's receipt")
	if n := len(e.ledger(t)); n != 1 {
		t.Errorf("ledger has %d entries after repeat, want 1", n)
	}
}

// A later attempt of the same job+stage+type (a revised draft in round 2, a new trace span,
// a spent wallet, another judge round) is the same key: it gets the first receipt.
func TestOtherAttemptHitsSameKey(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t)
	first, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	art2 := e.putArtifact(t, 2, []byte("# Reply, revised\n"))
	r := e.req()
	r.Package.Artifacts = append(r.Package.Artifacts, art2)
	r.Artifact = proto.Clone(art2).(*handoffv1.Artifact)
	r.Package.Evaluator.Rounds = 2
	r.Package.Budget.RevisionsRemaining = 0
	r.Package.NextHint = "retry after timeout"
	r.Package.Trace.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
	second, err := e.client.Write(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !second.GetDuplicate() {
		t.Errorf("retry: duplicate=false, want the first receipt, duplicate")
	}
	testkit.Equal(t, second.GetReceipt(), first.GetReceipt(), "the retry's receipt")
	if second.GetReceipt().GetIdempotencyKey() != wantKey {
		t.Errorf("key %q", second.GetReceipt().GetIdempotencyKey())
	}
	if n := len(e.ledger(t)); n != 1 {
		t.Errorf("ledger has %d entries, want 1", n)
	}
	if got := writeback.Key(jobID, stage, artType); got != wantKey {
		t.Errorf("Key = %q", got)
	}
}

// slowTarget delays every write, so concurrent callers find the key in flight; with hold
// set, a write also waits until hold is closed, and fails if its context ends first (as a
// target's network call would).
type slowTarget struct {
	writeback.Target
	delay time.Duration
	hold  chan struct{}
	calls atomic.Int32
}

func (s *slowTarget) Write(ctx context.Context, w writeback.WriteInput) (string, error) {
	s.calls.Add(1)
	time.Sleep(s.delay)
	if s.hold != nil {
		select {
		case <-s.hold:
		case <-ctx.Done():
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
	return s.Target.Write(ctx, w)
}

func TestConcurrentSameKeyWritesOnce(t *testing.T) {
	slow := &slowTarget{delay: 150 * time.Millisecond}
	e := newEnv(t, envOpts{targets: func(st *store.Bolt) []writeback.Target {
		slow.Target = writeback.NewLedger(st)
		return []writeback.Target{slow}
	}})
	ctx := ctxT(t)
	const n = 200
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		receipts = make([]*handoffv1.Receipt, n)
		fresh    atomic.Int32
		aborted  atomic.Int32
		errs     = make(chan error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// The caller's retry loop: Aborted (in flight) means try again after RetryInfo's
			// delay (shortened here to keep the test quick); anything else is final.
			for {
				resp, err := e.client.Write(ctx, e.req())
				if err == nil {
					receipts[i] = resp.GetReceipt()
					if !resp.GetDuplicate() {
						fresh.Add(1)
					}
					return
				}
				st := status.Convert(err)
				if st.Code() != codes.Aborted {
					errs <- err
					return
				}
				aborted.Add(1)
				if !strings.Contains(st.Message(), "request with idempotency key "+wantKey+" is in flight; retry") {
					errs <- errors.New("aborted message: " + st.Message())
					return
				}
				var delay time.Duration
				for _, d := range st.Details() {
					if ri, ok := d.(*errdetails.RetryInfo); ok {
						delay = ri.GetRetryDelay().AsDuration()
					}
				}
				if delay <= 0 {
					errs <- errors.New("aborted without RetryInfo")
					return
				}
				select {
				case <-time.After(min(delay, 20*time.Millisecond)):
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if got := fresh.Load(); got != 1 {
		t.Errorf("%d answers were non-duplicate writes, want 1", got)
	}
	if aborted.Load() == 0 {
		t.Error("no caller ever saw the key in flight; the test did not exercise Pending")
	}
	if got := slow.calls.Load(); got != 1 {
		t.Errorf("target called %d times, want 1", got)
	}
	if got := len(e.ledger(t)); got != 1 {
		t.Errorf("ledger has %d entries, want 1", got)
	}
	for i, rc := range receipts {
		if !testkit.Equal(t, rc, receipts[0], fmt.Sprintf("answer %d's receipt", i)) {
			t.FailNow()
		}
	}
	t.Logf("200 callers: 1 write, %d Aborted answers retried", aborted.Load())
}

// flakyTarget fails (or panics) its first failures calls, then delegates.
type flakyTarget struct {
	writeback.Target
	failures int32
	panics   bool
	calls    atomic.Int32
}

func (f *flakyTarget) Write(ctx context.Context, w writeback.WriteInput) (string, error) {
	if f.calls.Add(1) <= f.failures {
		if f.panics {
			panic("target blew up")
		}
		return "", errors.New("connection reset by peer")
	}
	return f.Target.Write(ctx, w)
}

func TestFailingTargetReleasesClaim(t *testing.T) {
	for _, panics := range []bool{false, true} {
		name := "error"
		if panics {
			name = "panic"
		}
		t.Run(name, func(t *testing.T) {
			flaky := &flakyTarget{failures: 2, panics: panics}
			e := newEnv(t, envOpts{targets: func(st *store.Bolt) []writeback.Target {
				flaky.Target = writeback.NewLedger(st)
				return []writeback.Target{flaky}
			}})
			ctx := ctxT(t)
			for i := range 2 {
				_, err := e.client.Write(ctx, e.req())
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("attempt %d: %v, want Unavailable", i+1, err)
				}
				if s := e.claimState(t, wantKey); s != 0 {
					t.Fatalf("after a failed write the key is %s, want released", s)
				}
			}
			resp, err := e.client.Write(ctx, e.req())
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetDuplicate() {
				t.Error("the retry that wrote reported duplicate")
			}
			if n := len(e.ledger(t)); n != 1 {
				t.Errorf("ledger has %d entries, want 1", n)
			}
			again, err := e.client.Write(ctx, e.req())
			if err != nil || !again.GetDuplicate() {
				t.Errorf("repeat: %v %v", again, err)
			}
			testkit.Equal(t, again.GetReceipt(), resp.GetReceipt(), "the repeat's receipt")
			if got := flaky.calls.Load(); got != 3 {
				t.Errorf("target called %d times, want 3", got)
			}
		})
	}
}

func TestArtifactReadFailuresRelease(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		path := strings.TrimPrefix(e.art.GetUri(), "file://")
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		_, err := e.client.Write(ctxT(t), e.req())
		if status.Code(err) != codes.NotFound {
			t.Fatalf("%v, want NotFound", err)
		}
		if s := e.claimState(t, wantKey); s != 0 {
			t.Errorf("key is %s, want released", s)
		}
		if n := len(e.ledger(t)); n != 0 {
			t.Errorf("ledger has %d entries", n)
		}
	})
	t.Run("tampered", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		path := strings.TrimPrefix(e.art.GetUri(), "file://")
		if err := os.WriteFile(path, []byte("# Reply\n\nWe promise a full refund.\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := e.client.Write(ctxT(t), e.req())
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "sha256") {
			t.Fatalf("%v, want FailedPrecondition on sha256", err)
		}
		if s := e.claimState(t, wantKey); s != 0 {
			t.Errorf("key is %s, want released", s)
		}
		if n := len(e.ledger(t)); n != 0 {
			t.Errorf("ledger has %d entries", n)
		}
	})
}

// A caller that gives up mid-write does not abandon the write: the receipt is still stored,
// and the caller's retry gets it. The caller gives up once its write is in the target (its
// key claimed), which holds the write until the call has ended: a fixed deadline could pass
// before the call even reached the claim.
func TestCallerCancelDoesNotAbandonClaimedWrite(t *testing.T) {
	slow := &slowTarget{hold: make(chan struct{})}
	e := newEnv(t, envOpts{targets: func(st *store.Bolt) []writeback.Target {
		slow.Target = writeback.NewLedger(st)
		return []writeback.Target{slow}
	}})
	release := sync.OnceFunc(func() { close(slow.hold) })
	t.Cleanup(release) // before the server stops, should the test end early
	caller, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := e.client.Write(caller, e.req())
		ended <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the write in the target", func() bool { return slow.calls.Load() > 0 })
	cancel()
	if err := <-ended; status.Code(err) != codes.Canceled {
		t.Fatalf("%v, want Canceled", err)
	}
	// A call after it on the same connection is read after its RST_STREAM: once that call is
	// answered, the server has seen the caller leave.
	if _, err := e.client.Write(ctxT(t), &handoffv1.WriteRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a call after the cancelled one: %v, want InvalidArgument", err)
	}
	release()
	testkit.Eventually(t, 5*time.Second, "the receipt stored", func() bool { return e.claimState(t, wantKey) == store.Done })
	resp, err := e.client.Write(ctxT(t), e.req())
	if err != nil || !resp.GetDuplicate() {
		t.Fatalf("retry: %v %v, want the stored receipt", resp, err)
	}
	if n := len(e.ledger(t)); n != 1 {
		t.Errorf("ledger has %d entries, want 1", n)
	}
}

// The writeback died after the ledger append and before storing the receipt (a write made
// when entry and receipt were still two steps): once the pending claim lapses, the retry
// finds the ledger entry instead of appending again, and its receipt names that entry.
func TestLedgerRecoversWriteOfDeadWriter(t *testing.T) {
	const ttl = 200 * time.Millisecond
	e := newEnv(t, envOpts{mod: func(o *writeback.Options) { o.PendingTTL = ttl }})
	ctx := ctxT(t)
	if s, _, _, err := e.st.Claim(ctx, wantKey, ttl); err != nil || s != store.Claimed {
		t.Fatalf("claim: %v %v", s, err)
	}
	entry, _, err := e.st.AppendLedger(ctx, wantKey, e.body)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Write(ctx, e.req()); status.Code(err) != codes.Aborted {
		t.Fatalf("%v, want Aborted while the dead writer's claim is pending", err)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	resp, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetReceipt().GetExternalId() != entry.ID {
		t.Errorf("external id %q, want the existing entry %q", resp.GetReceipt().GetExternalId(), entry.ID)
	}
	entries := e.ledger(t)
	if len(entries) != 1 || entries[0].Offers != 2 {
		t.Errorf("ledger %+v; want the one entry, offered twice", entries)
	}
	again, err := e.client.Write(ctx, e.req())
	if err != nil || !again.GetDuplicate() {
		t.Errorf("repeat: %v %v; want the retry's receipt, duplicate", again, err)
	}
	testkit.Equal(t, again.GetReceipt(), resp.GetReceipt(), "the repeat's receipt")
}

// countingStore is one bbolt store that counts the receipts stored apart from a write
// (Complete) and those stored with one (AppendLedgerComplete).
type countingStore struct {
	*store.Bolt
	completes, withWrite atomic.Int32
}

func (c *countingStore) Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error {
	c.completes.Add(1)
	return c.Bolt.Complete(ctx, key, owner, value, ttl)
}

func (c *countingStore) AppendLedgerComplete(ctx context.Context, key string, payload []byte, idemKey, owner string, ttl time.Duration, result func(store.LedgerEntry) ([]byte, error)) (store.LedgerEntry, bool, error) {
	c.withWrite.Add(1)
	return c.Bolt.AppendLedgerComplete(ctx, key, payload, idemKey, owner, ttl, result)
}

// The ledger on the service's own store writes the entry and its receipt in one
// transaction: the receipt is the marshalled response naming the entry, kept for
// ReceiptTTL, and nothing stores it apart. A ledger on another store is written first and
// its receipt stored after, as for any target.
func TestLedgerWritesEntryAndReceiptTogether(t *testing.T) {
	for _, together := range []bool{true, false} {
		name := map[bool]string{true: "same store", false: "another store"}[together]
		t.Run(name, func(t *testing.T) {
			other := openStore(t)
			var receipts *countingStore // the service's store
			e := newEnv(t, envOpts{
				targets: func(st *store.Bolt) []writeback.Target {
					receipts = &countingStore{Bolt: st}
					if together {
						return []writeback.Target{writeback.NewLedger(receipts)}
					}
					return []writeback.Target{writeback.NewLedger(other)}
				},
				mod: func(o *writeback.Options) { o.Store, o.ReceiptTTL = receipts, time.Hour },
			})
			ctx := ctxT(t)
			resp, err := e.client.Write(ctx, e.req())
			if err != nil {
				t.Fatal(err)
			}
			wantWith, wantApart, ledger := int32(0), int32(1), store.Ledger(other)
			if together {
				wantWith, wantApart, ledger = 1, 0, e.st
			}
			if receipts.withWrite.Load() != wantWith || receipts.completes.Load() != wantApart {
				t.Errorf("receipts stored with the write %d, apart %d; want %d and %d", receipts.withWrite.Load(), receipts.completes.Load(), wantWith, wantApart)
			}
			entries, err := ledger.LedgerEntries(ctx)
			if err != nil || len(entries) != 1 || entries[0].ID != resp.GetReceipt().GetExternalId() {
				t.Fatalf("ledger %+v, %v; want one entry, the receipt's %s", entries, err, resp.GetReceipt().GetExternalId())
			}
			st, v, err := e.st.Lookup(ctx, wantKey)
			stored := &handoffv1.WriteResponse{}
			if err != nil || st != store.Done || proto.Unmarshal(v, stored) != nil {
				t.Fatalf("stored receipt %v %v (%v); want done with the response %v", st, stored, err, resp)
			}
			if !testkit.Equal(t, stored, resp, "the stored response") {
				t.FailNow()
			}
			again, err := e.client.Write(ctx, e.req())
			if err != nil || !again.GetDuplicate() {
				t.Fatalf("repeat: %v %v; want the first receipt, duplicate", again, err)
			}
			if !testkit.Equal(t, again.GetReceipt(), resp.GetReceipt(), "the repeat's receipt") {
				t.FailNow()
			}
		})
	}
}

// Documented behaviour: a repeat after ReceiptTTL is a new write. The ledger, which
// enforces the key, answers it with the first entry instead of writing a second.
func TestReceiptTTLExpiry(t *testing.T) {
	const ttl = 150 * time.Millisecond
	e := newEnv(t, envOpts{mod: func(o *writeback.Options) { o.ReceiptTTL = ttl }})
	ctx := ctxT(t)
	first, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := e.client.Write(ctx, e.req()); err != nil || !resp.GetDuplicate() {
		t.Fatalf("repeat within ttl: %v %v", resp, err)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	resp, err := e.client.Write(ctx, e.req())
	if err != nil || resp.GetDuplicate() {
		t.Fatalf("repeat after ttl: %v %v, want a new write", resp, err)
	}
	if resp.GetReceipt().GetExternalId() != first.GetReceipt().GetExternalId() {
		t.Errorf("new write's entry %s, want the key's first %s", resp.GetReceipt().GetExternalId(), first.GetReceipt().GetExternalId())
	}
	if entries := e.ledger(t); len(entries) != 1 || entries[0].Offers != 2 {
		t.Errorf("ledger %+v; want one entry, offered twice (the receipt had expired)", entries)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	files, err := artifact.NewFiles(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	ledger := writeback.NewLedger(st)
	cases := map[string]writeback.Options{
		"no store":        {Artifacts: files, Targets: []writeback.Target{ledger}},
		"no artifacts":    {Store: st, Targets: []writeback.Target{ledger}},
		"no targets":      {Store: st, Artifacts: files},
		"duplicate names": {Store: st, Artifacts: files, Targets: []writeback.Target{ledger, writeback.NewLedger(st)}},
		"negative ttl":    {Store: st, Artifacts: files, Targets: []writeback.Target{ledger}, ReceiptTTL: -time.Second},
	}
	for name, o := range cases {
		if _, err := writeback.New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := writeback.New(writeback.Options{Store: st, Artifacts: files, Targets: []writeback.Target{ledger}}); err != nil {
		t.Errorf("minimal options: %v", err)
	}
}

// The gate runs before idempotency: a repeat of a completed key whose package now carries a
// FAIL verdict (or names an unknown target) is refused, not answered with the stored receipt.
func TestRefusedRepeatOfCompletedKeyIsNotReplayed(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t)
	first, err := e.client.Write(ctx, e.req())
	if err != nil {
		t.Fatal(err)
	}
	if s := e.claimState(t, wantKey); s != store.Done {
		t.Fatalf("key is %s after the write, want done", s)
	}

	failed := e.req()
	failed.Package.Evaluator = &handoffv1.Evaluator{
		LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 2,
		Failures: []*handoffv1.Failure{{Code: "citation_missing"}},
	}
	resp, err := e.client.Write(ctx, failed)
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition ||
		st.Message() != "writeback refused: last verdict is FAIL; the judge must pass first" {
		t.Fatalf("FAIL repeat: %v %v, want FailedPrecondition (not the stored receipt)", resp, err)
	}

	unknown := e.req()
	unknown.Target = "crm"
	if _, err := e.client.Write(ctx, unknown); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown-target repeat: %v, want InvalidArgument", err)
	}

	// The receipt is untouched: a PASS repeat still gets it.
	again, err := e.client.Write(ctx, e.req())
	if err != nil || !again.GetDuplicate() {
		t.Fatalf("PASS repeat: %v %v, want the first receipt, duplicate", again, err)
	}
	if !testkit.Equal(t, again.GetReceipt(), first.GetReceipt(), "the PASS repeat's receipt") {
		t.FailNow()
	}
	if n := len(e.ledger(t)); n != 1 {
		t.Errorf("ledger has %d entries, want 1", n)
	}
}

// With identity on the chain (step 4), only the coordinator may write; the refusal comes
// before anything is validated, claimed or written.
func TestOnlyCoordinatorMayWrite(t *testing.T) {
	signers := map[string]*identity.Signer{}
	pubs := map[string]ed25519.PublicKey{}
	for _, svc := range []string{"coordinator", "agentrunner"} {
		s, err := identity.GenerateSigner(svc)
		if err != nil {
			t.Fatal(err)
		}
		signers[svc], pubs[svc] = s, s.PublicKey()
	}
	verifier, err := identity.NewVerifier("writeback", pubs)
	if err != nil {
		t.Fatal(err)
	}
	as := func(t *testing.T, caller string) *env {
		return newEnv(t, envOpts{
			server: []server.Option{server.WithSecurity(nil, identity.NewAuthorizer(identity.WithVerifier(verifier), identity.WithPolicy(identity.DefaultPolicy())))},
			dial:   []grpc.DialOption{grpc.WithPerRPCCredentials(signers[caller].PerRPCCredentials())},
		})
	}

	t.Run("agentrunner is denied", func(t *testing.T) {
		e := as(t, "agentrunner")
		resp, err := e.client.Write(ctxT(t), e.req())
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%v %v, want PermissionDenied", resp, err)
		}
		if !strings.Contains(status.Convert(err).Message(), "allowed callers: coordinator") {
			t.Errorf("message %q", status.Convert(err).Message())
		}
		if n := len(e.ledger(t)); n != 0 {
			t.Errorf("ledger has %d entries, want 0", n)
		}
		if s := e.claimState(t, wantKey); s != 0 {
			t.Errorf("key is %s, want untouched", s)
		}
	})

	t.Run("coordinator writes", func(t *testing.T) {
		e := as(t, "coordinator")
		resp, err := e.client.Write(ctxT(t), e.req())
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetDuplicate() || resp.GetReceipt().GetIdempotencyKey() != wantKey {
			t.Errorf("response %v", resp)
		}
		if n := len(e.ledger(t)); n != 1 {
			t.Errorf("ledger has %d entries, want 1", n)
		}
	})

	t.Run("no token is unauthenticated", func(t *testing.T) {
		e := newEnv(t, envOpts{server: []server.Option{
			server.WithSecurity(nil, identity.NewAuthorizer(identity.WithVerifier(verifier), identity.WithPolicy(identity.DefaultPolicy()))),
		}})
		if _, err := e.client.Write(ctxT(t), e.req()); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%v, want Unauthenticated", err)
		}
		if n := len(e.ledger(t)); n != 0 {
			t.Errorf("ledger has %d entries, want 0", n)
		}
	})
}

// A server that registers the service without its interceptors must not write ungated.
func TestWriteWithoutChainRefuses(t *testing.T) {
	e := newEnv(t, envOpts{})
	srv, err := writeback.New(writeback.Options{
		Store: e.st, Artifacts: e.files, Targets: []writeback.Target{writeback.NewLedger(e.st)},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	writeback.Register(gs, srv)
	bare := handoffv1.NewWritebackServiceClient(testkit.Serve(t, gs))

	r := e.req()
	r.Package.Evaluator.LastVerdict = handoffv1.Verdict_VERDICT_FAIL
	if _, err := bare.Write(ctxT(t), r); status.Code(err) != codes.Internal ||
		!strings.Contains(status.Convert(err).Message(), "without its interceptor chain") {
		t.Fatalf("%v, want Internal: no interceptor chain", err)
	}
	if n := len(e.ledger(t)); n != 0 {
		t.Errorf("ledger has %d entries, want 0", n)
	}
	if s := e.claimState(t, wantKey); s != 0 {
		t.Errorf("key is %s, want untouched", s)
	}
}

// The assembled server serves health (SERVING) and reflection next to the service.
func TestServiceServesHealthAndReflection(t *testing.T) {
	srv, err := writeback.New(writeback.Options{
		Store: openStore(t), Artifacts: openFiles(t), Targets: []writeback.Target{writeback.NewLedger(nil)},
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := assemble(t, srv)
	conn := testkit.Serve(t, gs)
	for _, svc := range []string{"", handoffv1.WritebackService_ServiceDesc.ServiceName} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, resp, err)
		}
	}
	info := gs.GRPC().GetServiceInfo()
	for _, svc := range []string{handoffv1.WritebackService_ServiceDesc.ServiceName, "grpc.reflection.v1.ServerReflection"} {
		if _, ok := info[svc]; !ok {
			t.Errorf("service %s not registered (have %v)", svc, info)
		}
	}
}

func openStore(t *testing.T) *store.Bolt {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openFiles(t *testing.T) *artifact.Files {
	t.Helper()
	files, err := artifact.NewFiles(filepath.Join(t.TempDir(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}
