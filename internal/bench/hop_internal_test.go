package bench

import (
	"context"
	"testing"
)

// TestHopRigHops: figures B and C's hop works as timed, a few times over on one worker's
// wallet: each hop is accepted and paid from that wallet, which is its job's (a package pays
// only from its own job's wallet).
func TestHopRigHops(t *testing.T) {
	ctx := context.Background()
	r, err := newHopRig(ctx, hopConfig{Store: StoreBolt, BaseDir: t.TempDir(), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	before, err := r.st.Wallet(ctx, r.workers[0].walletID)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := r.hop(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	after, err := r.st.Wallet(ctx, r.workers[0].walletID)
	if err != nil {
		t.Fatal(err)
	}
	if paid := before.GetHopsRemaining() - after.GetHopsRemaining(); paid != 3 || r.agent.Calls() != 3 {
		t.Fatalf("3 hops paid %d hops from the worker's wallet and ran the agent %d times; want 3 and 3", paid, r.agent.Calls())
	}
}
