package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// failingAppends is a store whose AppendEvent fails: this process's event writes do not go
// through (a store hiccup here), while another process's writes to the same store do.
type failingAppends struct{ store.Store }

func (failingAppends) AppendEvent(context.Context, string, *handoffv1.JobEvent) (uint64, error) {
	return 0, errors.New("append refused")
}

// TestStaleWakesLeaveThePoll: a watch caught up with this process's writes is woken by
// writes here that add nothing (every append failed); those wakes skip the store read, but
// must not keep putting off the poll that finds another process's events: the other
// writer's event reaches the watch while the empty wakes go on.
func TestStaleWakesLeaveThePoll(t *testing.T) {
	bolt, err := store.Open(filepath.Join(t.TempDir(), "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	ctx := context.Background()
	const runID = "run_stale"
	first := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED, Stage: "draft"}
	if _, _, err := bolt.CreateRun(ctx, &handoffv1.Job{RunId: runID, JobId: "tkt", State: handoffv1.JobState_JOB_STATE_RUNNING}, first); err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: Options{Store: failingAppends{bolt}, Now: time.Now}, feeds: map[string]*feed{}, stopping: make(chan struct{}),
		log: slog.New(slog.DiscardHandler)}
	s.keepFeed(runID) // this process wrote the first event
	s.published(runID, []*handoffv1.JobEvent{first})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	handoffv1.RegisterCoordinatorServiceServer(srv, s)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := handoffv1.NewCoordinatorServiceClient(conn).WatchJob(wctx, &handoffv1.WatchJobRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetEvent().GetSeq() != 1 {
		t.Fatalf("first event = %v, %v; want seq 1", r, err)
	}
	// This process keeps trying to write events, none of which is written.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				s.appendEvents(ctx, runID, []*handoffv1.JobEvent{{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: "draft"}})
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	// Another process (the replica driving the run) writes the next event.
	if _, err := bolt.AppendEvent(ctx, runID, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: "judge"}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *handoffv1.WatchJobResponse, 1)
	go func() {
		r, _ := stream.Recv()
		got <- r
	}()
	select {
	case r := <-got:
		if r.GetEvent().GetSeq() != 2 || r.GetEvent().GetStage() != "judge" {
			t.Fatalf("next event = %v; want the other process's, seq 2", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other process's event never reached the watch while this process's empty writes went on")
	}
}
