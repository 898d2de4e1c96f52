package agentrunner_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// TestAgentChangingItsPackageMovesNoCharge: the agent's Input.Package is the very request the
// interceptors hold (hop.Receive), so an agent that breaks "must not modify" must not steer
// what the chain settles after it runs. A failed stage is unmarked as paid under the key and
// wallet it was claimed and debited with, so its next attempt is charged, whatever the agent
// set the package's visit or wallet to; a completed stage records the wallet that paid as
// its payer, not a wallet the agent named.
func TestAgentChangingItsPackageMovesNoCharge(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		change func(p *handoffv1.HandoffPackage)
	}{
		{"visit", func(p *handoffv1.HandoffPackage) { p.Visit = 7 }},
		{"wallet", func(p *handoffv1.HandoffPackage) { p.Budget.WalletId = "w-other" }},
		{"job", func(p *handoffv1.HandoffPackage) { p.JobId = "job-other" }},
	} {
		t.Run("failed, "+c.name, func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			for id, job := range map[string]string{"w-full": "job-1", "w-other": "job-1"} {
				if _, err := st.OpenWallet(ctx, id, job, &handoffv1.Budget{UsdRemainingMicros: 9000, HopsRemaining: 3}); err != nil {
					t.Fatal(err)
				}
			}
			var failOnce atomic.Bool
			failOnce.Store(true)
			ag := &fake{card: agentrunner.RoleCard{Name: "review"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
				if failOnce.Swap(false) {
					c.change(in.Package)
					return nil, errors.New("model overloaded")
				}
				return writeOne(ctx, in)
			}}
			e := start(t, agentrunner.Options{Store: st, Agents: []agentrunner.Agent{ag}}, "")
			p := pkg("review")
			p.Budget.WalletId = "w-full"
			for i, want := range []handoffv1.StageStatus{handoffv1.StageStatus_STAGE_STATUS_FAILED, handoffv1.StageStatus_STAGE_STATUS_COMPLETED} {
				msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
				if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != want {
					t.Fatalf("delivery %d: %v, %v; want %s", i+1, msgs, err, want)
				}
				if got, wantHops := msgs[0].GetAck().GetWallet().GetHopsRemaining(), uint32(2-i); got != wantHops {
					t.Fatalf("delivery %d: ack.wallet has %d hops; want %d (the attempt after a failed run is a new hop)", i+1, got, wantHops)
				}
			}
			if w, _ := st.Wallet(ctx, "w-full"); w.GetHopsRemaining() != 1 {
				t.Fatalf("w-full holds %d hops after a failed and a repeated run; want 1", w.GetHopsRemaining())
			}
			if w, _ := st.Wallet(ctx, "w-other"); w.GetHopsRemaining() != 3 {
				t.Fatalf("w-other, which paid nothing, holds %d hops; want 3", w.GetHopsRemaining())
			}
		})
	}

	t.Run("completed, wallet", func(t *testing.T) {
		st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		for _, id := range []string{"w-full", "w-other"} {
			if _, err := st.OpenWallet(ctx, id, "job-1", &handoffv1.Budget{UsdRemainingMicros: 9000, HopsRemaining: 3}); err != nil {
				t.Fatal(err)
			}
		}
		ag := &fake{card: agentrunner.RoleCard{Name: "review"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
			in.Package.Budget.WalletId = "w-other"
			return writeOne(ctx, in)
		}}
		e := start(t, agentrunner.Options{Store: st, Agents: []agentrunner.Agent{ag}}, "")
		p := pkg("review")
		p.Budget.WalletId = "w-full"
		if msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p}); err != nil || len(msgs) != 2 ||
			msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			t.Fatalf("delivery: %v, %v", msgs, err)
		}
		// The re-delivery from the wallet that paid is answered as paid; from the other
		// wallet it is not (the coordinator then debits that hop itself).
		for _, c := range []struct {
			wallet string
			paid   bool
		}{{"w-full", true}, {"w-other", false}} {
			p.Budget.WalletId = c.wallet
			msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
			if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
				t.Fatalf("re-delivery from %s: %v, %v; want DUPLICATE", c.wallet, msgs, err)
			}
			ack := msgs[0].GetAck()
			if got := ack.GetPrior().GetWalletId(); got != "w-full" {
				t.Fatalf("re-delivery from %s: the completion names %q as its payer; want w-full, which paid", c.wallet, got)
			}
			if paid := ack.GetWallet() != nil; paid != c.paid {
				t.Fatalf("re-delivery from %s: answered as paid=%v; want %v", c.wallet, paid, c.paid)
			}
		}
	})
}
