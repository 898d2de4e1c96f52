package agentrunner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// openWallet puts wallet id of job-1 (pkg's job) holding b into the runner's store and
// returns a package whose budget names it.
func openWallet(t *testing.T, e *env, id string, b *handoffv1.Budget, stage string) *handoffv1.HandoffPackage {
	t.Helper()
	return openJobWallet(t, e, id, "job-1", b, stage)
}

// openJobWallet is openWallet for a package of job job.
func openJobWallet(t *testing.T, e *env, id, job string, b *handoffv1.Budget, stage string) *handoffv1.HandoffPackage {
	t.Helper()
	if _, err := e.st.OpenWallet(context.Background(), id, job, b); err != nil {
		t.Fatal(err)
	}
	p := pkg(stage)
	p.JobId = job
	p.Budget.WalletId = id
	return p
}

func wallet(t *testing.T, e *env, id string) *handoffv1.Budget {
	t.Helper()
	w, err := e.st.Wallet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func check(t *testing.T, e *env, req *handoffv1.DeliverRequest) *handoffv1.Ack {
	t.Helper()
	cr, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: req.Package, Agent: req.Agent, RequiredTools: req.RequiredTools})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return cr.GetAck()
}

// The chain decides in the order schema, role, duplicate, budget.
func TestChainOrder(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")

	// Schema before role: a package that is both broken and misrouted is REJECTED_SCHEMA.
	p := pkg("nosuch")
	p.JobId = ""
	req := &handoffv1.DeliverRequest{Package: p, Agent: "drafter", RequiredTools: []string{"crm.patch"}}
	msgs, err := deliver(t, e.client, req)
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
		t.Fatalf("schema+role: %v %v", msgs, err)
	}
	if fields, _ := reasonFields(msgs[0].GetAck()); len(fields) != 1 || fields[0] != "job_id" {
		t.Fatalf("schema+role reasons %v", msgs[0].GetAck().GetReasons())
	}
	if !testkit.Equal(t, check(t, e, req), msgs[0].GetAck(), "Check's ack against Deliver's") {
		t.FailNow()
	}

	// Role before budget: a misrouted package on an empty stored wallet is REJECTED_ROLE and
	// takes nothing from the wallet.
	p = openWallet(t, e, "w-role", &handoffv1.Budget{UsdRemainingMicros: 100, HopsRemaining: 1}, "nosuch")
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE || msgs[0].GetAck().GetWallet() != nil {
		t.Fatalf("role: %v %v", msgs, err)
	}
	if w := wallet(t, e, "w-role"); w.HopsRemaining != 1 {
		t.Fatalf("a REJECTED_ROLE package paid a hop: %v", w)
	}
	// ... and claims no completion key.
	if st, _, _ := e.st.Lookup(context.Background(), agentrunner.CompletionKey(p.JobId, p.Stage, 0, 0)); st != 0 {
		t.Fatalf("a REJECTED_ROLE package left a record: %v", st)
	}

	// Duplicate before budget: a completed stage re-delivered on a wallet that is now empty
	// is DUPLICATE, not REJECTED_BUDGET, and carries the wallet that already paid for it
	// (so the coordinator does not pay a second time).
	p = openJobWallet(t, e, "w-last", "job-last", &handoffv1.Budget{UsdRemainingMicros: 100, HopsRemaining: 1}, "draft")
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 0 {
		t.Fatalf("last hop: %v %v", msgs, err)
	}
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 0 || msgs[0].GetAck().GetWallet().GetWalletId() != "w-last" {
		t.Fatalf("re-delivery on the emptied wallet: %v %v", msgs, err)
	}
	if n := ag.calls.Load(); n != 1 {
		t.Fatalf("agent calls %d, want 1", n)
	}
}

// A re-delivery of a completed stage is answered DUPLICATE and pays no hop; the first
// delivery paid one and said so in ack.wallet, and the re-delivery's ack says the same
// wallet paid (so the sender does not debit it either). Check reads the wallet and never
// debits it. A re-delivery from another wallet (another run of the same job) gets no
// wallet: that run has not paid for the hop, and its sender debits it.
func TestRedeliveryDoesNotDebit(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	p := openWallet(t, e, "run-1", &handoffv1.Budget{UsdRemainingMicros: 50000, RevisionsRemaining: 2, HopsRemaining: 8}, "draft")
	req := &handoffv1.DeliverRequest{Package: p}

	if a := check(t, e, req); a.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || a.GetWallet() != nil {
		t.Fatalf("Check: %v", a)
	}
	if w := wallet(t, e, "run-1"); w.HopsRemaining != 8 {
		t.Fatalf("Check debited the wallet: %v", w)
	}

	msgs, err := deliver(t, e.client, req)
	if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("first delivery: %v %v", msgs, err)
	}
	want := &handoffv1.Budget{UsdRemainingMicros: 50000, RevisionsRemaining: 2, HopsRemaining: 7, WalletId: "run-1"}
	if got := msgs[0].GetAck().GetWallet(); msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || !proto.Equal(got, want) {
		t.Fatalf("first ack %v, want ACCEPTED with wallet %v", msgs[0].GetAck(), want)
	}
	if w := wallet(t, e, "run-1"); w.HopsRemaining != 7 {
		t.Fatalf("wallet after the first delivery %v, want 7 hops", w)
	}

	for range 3 {
		msgs, err = deliver(t, e.client, req)
		if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
			t.Fatalf("re-delivery: %v %v", msgs, err)
		}
		if !proto.Equal(msgs[0].GetAck().GetWallet(), want) || len(msgs[0].GetAck().GetPrior().GetArtifacts()) != 1 {
			t.Fatalf("re-delivery ack %v: want the prior result and the wallet that paid, %v", msgs[0].GetAck(), want)
		}
	}
	other := proto.Clone(req).(*handoffv1.DeliverRequest)
	other.Package.Budget.WalletId = "run-2"
	msgs, err = deliver(t, e.client, other)
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE || msgs[0].GetAck().GetWallet() != nil {
		t.Fatalf("re-delivery from another run's wallet: %v %v; want DUPLICATE without a wallet", msgs, err)
	}
	if w := wallet(t, e, "run-1"); w.HopsRemaining != 7 {
		t.Fatalf("re-deliveries debited the wallet: %v", w)
	}
	if a := check(t, e, req); a.GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("Check after: %v", a)
	}
	if n := ag.calls.Load(); n != 1 {
		t.Fatalf("agent calls %d, want 1", n)
	}

	// A revision (one more judge round) is a new stage run and pays its hop.
	p2 := proto.Clone(p).(*handoffv1.HandoffPackage)
	p2.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1, Failures: []*handoffv1.Failure{{Code: "citation_missing"}}}
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p2})
	if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 6 {
		t.Fatalf("revision: %v %v", msgs, err)
	}
}

// An empty stored wallet is REJECTED_BUDGET: the agent is not called and the completion key
// is released, so a later delivery with money runs the stage.
func TestEmptyWalletReleasesClaim(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	for _, c := range []struct {
		id     string
		b      *handoffv1.Budget
		fields []string
	}{
		{"broke", &handoffv1.Budget{UsdRemainingMicros: 0, HopsRemaining: 5}, []string{"budget.usd_remaining_micros"}},
		{"no-hops", &handoffv1.Budget{UsdRemainingMicros: 900, HopsRemaining: 0}, []string{"budget.hops_remaining"}},
	} {
		t.Run(c.id, func(t *testing.T) {
			// The package's own numbers look fine: the stored wallet is what counts.
			p := openJobWallet(t, e, c.id, "job-"+c.id, c.b, "draft")
			req := &handoffv1.DeliverRequest{Package: p}
			msgs, err := deliver(t, e.client, req)
			if err != nil || len(msgs) != 1 {
				t.Fatalf("%v %v", msgs, err)
			}
			ack := msgs[0].GetAck()
			fields, rules := reasonFields(ack)
			if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetWallet() != nil ||
				len(fields) != len(c.fields) || fields[0] != c.fields[0] || rules[0] != agentrunner.RuleBudgetEmpty {
				t.Fatalf("ack %v, want REJECTED_BUDGET on %v", ack, c.fields)
			}
			if !testkit.Equal(t, check(t, e, req), ack, "Check's ack against Deliver's") {
				t.FailNow()
			}
			if n := ag.calls.Load(); n != 0 {
				t.Fatalf("agent called %d times for an empty wallet", n)
			}
			key := agentrunner.CompletionKey(p.JobId, p.Stage, 0, 0)
			if st, _, err := e.st.Lookup(context.Background(), key); err != nil || st != 0 {
				t.Fatalf("claim after REJECTED_BUDGET: %v %v, want released", st, err)
			}

			// The same stage with money (another wallet) runs and pays.
			q := openJobWallet(t, e, c.id+"-topped", p.JobId, &handoffv1.Budget{UsdRemainingMicros: 5000, HopsRemaining: 3}, "draft")
			msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: q})
			if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 2 ||
				msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
				t.Fatalf("delivery with money: %v %v", msgs, err)
			}
			if n := ag.calls.Swap(0); n != 1 {
				t.Fatalf("agent calls %d, want 1", n)
			}
			if !testkit.Equal(t, wallet(t, e, c.id), c.b, "the empty wallet") {
				t.FailNow()
			}
		})
	}
}

// Concurrent deliveries of one stage pay one hop: the losers are Aborted (in flight) or
// DUPLICATE before the budget interceptor.
func TestConcurrentDeliveriesPayOnce(t *testing.T) {
	release := make(chan struct{})
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		<-release
		return writeOne(ctx, in)
	}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	p := openWallet(t, e, "run-c", &handoffv1.Budget{UsdRemainingMicros: 50000, HopsRemaining: 8}, "draft")
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
			errs <- err
		}()
	}
	testkit.Eventually(t, 5*time.Second, "the winner's agent to run", func() bool { return ag.calls.Load() > 0 })
	time.Sleep(50 * time.Millisecond) // let the losers reach the pending claim
	close(release)
	for range n {
		if err := <-errs; err != nil && status.Code(err) != codes.Aborted {
			t.Errorf("unexpected %v", err)
		}
	}
	if w := wallet(t, e, "run-c"); w.HopsRemaining != 7 || ag.calls.Load() != 1 {
		t.Fatalf("wallet %v after %d runs: want exactly one hop paid", w, ag.calls.Load())
	}
}

// A server that registers the runner without its interceptors fails closed.
func TestHandlersNeedChain(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	arts, _ := artifact.NewFiles(t.TempDir())
	srv, err := agentrunner.New(agentrunner.Options{Store: st, Artifacts: arts, Agents: []agentrunner.Agent{ag},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	agentrunner.Register(gs, srv)
	c := handoffv1.NewAgentRunnerServiceClient(testkit.Serve(t, gs))
	if _, err := deliver(t, c, &handoffv1.DeliverRequest{Package: pkg("draft")}); status.Code(err) != codes.Internal {
		t.Fatalf("Deliver without the chain: %v, want Internal", err)
	}
	if _, err := c.Check(context.Background(), &handoffv1.CheckRequest{Package: pkg("draft")}); status.Code(err) != codes.Internal {
		t.Fatalf("Check without the chain: %v, want Internal", err)
	}
	if ag.calls.Load() != 0 {
		t.Fatal("the agent ran without the chain")
	}
}

// TestPaysOnlyFromItsJobsWallet: over gRPC through the runner's whole chain, a package
// naming another job's wallet, or a wallet the store does not hold, is REJECTED_BUDGET
// naming budget.wallet_id on Deliver and Check: the agent is not called, the claim is
// released, the other job's wallet is untouched, and the answer shows nothing of it. The
// wallet's own job still pays from it.
func TestPaysOnlyFromItsJobsWallet(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	theirs := &handoffv1.Budget{UsdRemainingMicros: 31337, RevisionsRemaining: 2, HopsRemaining: 6}
	own := openJobWallet(t, e, "run-y", "job-y", theirs, "draft")

	for _, id := range []string{"run-y", "run-unknown"} {
		for i := range 6 { // as many hops as the other wallet holds
			p := pkg(fmt.Sprintf("draft%d", i))
			p.Budget.WalletId = id
			req := &handoffv1.DeliverRequest{Package: p, Agent: "draft"}
			msgs, err := deliver(t, e.client, req)
			if err != nil || len(msgs) != 1 {
				t.Fatalf("%s: %v %v", id, msgs, err)
			}
			ack := msgs[0].GetAck()
			fields, rules := reasonFields(ack)
			if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetWallet() != nil ||
				!slices.Equal(fields, []string{"budget.wallet_id"}) || rules[0] != "budget.wallet" {
				t.Fatalf("package of job-1 naming %s: ack %v; want REJECTED_BUDGET naming budget.wallet_id", id, ack)
			}
			if msg := ack.GetReasons()[0].GetMessage(); strings.Contains(msg, "31337") || strings.Contains(msg, "job-y") {
				t.Fatalf("the reason %q shows the other job's wallet", msg)
			}
			if !testkit.Equal(t, check(t, e, req), ack, "Check's ack against Deliver's") {
				t.FailNow()
			}
			if st, _, _ := e.st.Lookup(context.Background(), agentrunner.CompletionKey(p.JobId, p.Stage, 0, 0)); st != 0 {
				t.Fatalf("claim after REJECTED_BUDGET: %v, want released", st)
			}
		}
	}
	if n := ag.calls.Load(); n != 0 {
		t.Fatalf("agent called %d times for packages paying from another job's wallet", n)
	}
	if !testkit.Equal(t, wallet(t, e, "run-y"), theirs, "job-y's wallet (untouched)") {
		t.FailNow()
	}
	if _, err := e.st.Wallet(context.Background(), "run-unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a wallet was created for the unknown id: %v", err)
	}
	// Its own job pays from it.
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: own})
	if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 5 {
		t.Fatalf("job-y's own package: %v %v; want ACCEPTED with 5 hops left", msgs, err)
	}
}
