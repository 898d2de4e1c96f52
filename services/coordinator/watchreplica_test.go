package coordinator_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/coordinator"
)

// serveReplica serves c's CoordinatorService on loopback and returns a client of it.
func serveReplica(t *testing.T, c *coordinator.Server) handoffv1.CoordinatorServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	handoffv1.RegisterCoordinatorServiceServer(srv, c)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return handoffv1.NewCoordinatorServiceClient(conn)
}

// watchAll is a whole watch from after: every event until the watch ends.
func watchAll(client handoffv1.CoordinatorServiceClient, runID string, after uint64) ([]*handoffv1.JobEvent, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client.WatchJob(ctx, &handoffv1.WatchJobRequest{RunId: runID, AfterSeq: after})
	if err != nil {
		return nil, err
	}
	var evs []*handoffv1.JobEvent
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, r.GetEvent())
	}
}

// TestWatchAcrossReplicas: watches of one run on the replica driving it (from its feed)
// and on another replica sharing the store (from its store reads and poll), opened before
// the run goes on, midway (after_seq) and after it ended, each get exactly the stored
// timeline from their after_seq on: every event once, in order, as stored, and end with it.
func TestWatchAcrossReplicas(t *testing.T) {
	r := startReplicas(t)
	a := r.replica(t, "replica-a", r.st.Store)
	b := r.replica(t, "replica-b", r.st.Store)
	ca, cb := serveReplica(t, a), serveReplica(t, b)
	id := r.submit(t, a, "tkt_watch")
	type watch struct {
		name  string
		after uint64
		done  chan error
		evs   []*handoffv1.JobEvent
	}
	var watches []*watch
	open := func(name string, c handoffv1.CoordinatorServiceClient, after uint64) {
		w := &watch{name: name, after: after, done: make(chan error, 1)}
		watches = append(watches, w)
		go func() {
			var err error
			w.evs, err = watchAll(c, id, after)
			w.done <- err
		}()
	}
	open("driver's replica, from the start", ca, 0)
	open("other replica, from the start", cb, 0)
	for deadline := time.Now().Add(10 * time.Second); r.g.waits.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the draft was never called")
		}
	}
	open("driver's replica, after seq 1", ca, 1)
	open("other replica, after seq 1", cb, 1)
	r.g.release()
	if j := r.waitTerminal(t, []string{id}, 20*time.Second)[0]; j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run ended %s; want COMPLETED", j.GetState())
	}
	open("driver's replica, after it ended, after seq 3", ca, 3)
	open("other replica, after it ended", cb, 0)
	stored, err := r.st.Store.Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) < 5 {
		t.Fatalf("stored timeline has %d events; want the whole run's", len(stored))
	}
	for _, w := range watches {
		select {
		case err := <-w.done:
			if err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the watch did not end after the run did", w.name)
		}
		want := stored[w.after:]
		if len(w.evs) != len(want) {
			t.Fatalf("%s: %d events; want the %d stored after seq %d", w.name, len(w.evs), len(want), w.after)
		}
		for i, ev := range w.evs {
			if !proto.Equal(ev, want[i]) {
				t.Fatalf("%s: event %d is\n%v\nbut the store holds\n%v", w.name, i, ev, want[i])
			}
		}
	}
}
