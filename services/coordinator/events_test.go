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

// TestKeptFeed: the feed SubmitJob keeps for a run collects its first keptCap events while
// nobody watches, so a watch opened then starts from memory; a watcher's feed keeps up to
// feedCap; the feed goes once the driver has ended and the last watcher left.
func TestKeptFeed(t *testing.T) {
	s := &Server{opts: Options{Now: time.Now}, feeds: map[string]*feed{}}
	seq := uint64(0)
	publish := func(n int) {
		for range n {
			seq++
			s.published("run_k", []*handoffv1.JobEvent{{Seq: seq}})
		}
	}
	seqs := func(evs []*handoffv1.JobEvent) (out []uint64) {
		for _, ev := range evs {
			out = append(out, ev.GetSeq())
		}
		return out
	}
	publish(1) // before keepFeed: no feed, nothing kept
	if _, ok := s.fed("run_k", 0); ok {
		t.Fatal("a run nobody keeps or watches has a feed")
	}
	s.keepFeed("run_k")
	publish(2)
	if evs, ok := s.fed("run_k", 1); !ok || len(evs) != 2 || evs[0].GetSeq() != 2 {
		t.Fatalf("kept feed after 2 events = %v, %v; want seqs 2 and 3", seqs(evs), ok)
	}
	publish(keptCap + 2)
	if _, ok := s.fed("run_k", 1); ok {
		t.Fatal("an unwatched kept feed holds more than its first keptCap events")
	}
	evs, ok := s.fed("run_k", seq-keptCap)
	if !ok || len(evs) != keptCap || evs[keptCap-1].GetSeq() != seq {
		t.Fatalf("kept feed = %v, %v; want its last %d events", seqs(evs), ok, keptCap)
	}
	wake, stop := s.watchFeed("run_k")
	from := seq - keptCap
	publish(keptCap * 3)
	select {
	case <-wake:
	default:
		t.Fatal("a watcher got no signal for the events written after it came")
	}
	if evs, ok := s.fed("run_k", from); !ok || uint64(len(evs)) != seq-from {
		t.Fatalf("watched feed = %d events, %v; want all %d since the watch came", len(evs), ok, seq-from)
	}
	s.unkeepFeed("run_k") // the driver ended: the watcher still has its feed
	if _, ok := s.fed("run_k", seq-1); !ok {
		t.Fatal("the driver's end took the feed from its watcher")
	}
	stop()
	if _, ok := s.fed("run_k", seq-1); ok {
		t.Fatal("the feed outlived its driver and its last watcher")
	}
}

// TestCaughtUp: a watcher that has sent up to the feed's newest event is caught up; one
// behind it, a feed that missed an unnumbered event, or no feed at all is not (the watcher
// then reads the store).
func TestCaughtUp(t *testing.T) {
	s := &Server{opts: Options{Now: time.Now}, feeds: map[string]*feed{}}
	if s.caughtUp("run_c", 0) {
		t.Fatal("caught up on a run with no feed")
	}
	_, stop := s.watchFeed("run_c")
	defer stop()
	if s.caughtUp("run_c", 0) {
		t.Fatal("caught up on an empty feed (the run's events are in the store)")
	}
	s.published("run_c", []*handoffv1.JobEvent{{Seq: 1}, {Seq: 2}})
	if !s.caughtUp("run_c", 2) || s.caughtUp("run_c", 1) {
		t.Fatalf("caughtUp(2), caughtUp(1) = %v, %v; want true, false", s.caughtUp("run_c", 2), s.caughtUp("run_c", 1))
	}
	s.published("run_c", []*handoffv1.JobEvent{{}}) // written, but not numbered: only the store has it
	if s.caughtUp("run_c", 2) {
		t.Fatal("caught up although the feed missed an unnumbered event")
	}
}
