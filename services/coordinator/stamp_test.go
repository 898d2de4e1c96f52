package coordinator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// TestStampedWalletStays: an event carries the run's wallet as it stood when it was
// stamped; the wallet the driver mirrors in later (each debit) leaves the events stamped
// before as they were, since they share the wallet they were stamped with.
func TestStampedWalletStays(t *testing.T) {
	s := &Server{opts: Options{Now: time.Now}}
	job := &handoffv1.Job{RunId: "run_1", JobId: "tkt_1", Wallet: &handoffv1.Budget{WalletId: "run_1", HopsRemaining: 5, UsdRemainingMicros: 100}}
	ev := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT}
	s.stamp(job, ev)
	want := proto.Clone(ev.GetWallet())
	s.setWallet(job, &handoffv1.Budget{HopsRemaining: 4, UsdRemainingMicros: 90})
	if !proto.Equal(ev.GetWallet(), want) {
		t.Fatalf("event's wallet after the next debit = %v; want it as stamped, %v", ev.GetWallet(), want)
	}
	if job.GetWallet().GetHopsRemaining() != 4 || job.GetWallet().GetWalletId() != "run_1" {
		t.Fatalf("run's wallet = %v; want the new one, tagged run_1", job.GetWallet())
	}
	later := &handoffv1.JobEvent{}
	s.stamp(job, later)
	if later.GetWallet().GetHopsRemaining() != 4 {
		t.Fatalf("event stamped after the debit has %d hops; want 4", later.GetWallet().GetHopsRemaining())
	}
}
