package agentts_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// upgrading is a Go agent whose runner is upgraded while it serves: it declares handoff.v1
// until upgrade is set, then v1 and v2. Every v2 package it gets is checked to round-trip
// through the conversion: read back as v1 it is the v1 view the runner handed on, and that
// view converted again (with its deadline) is the v2 package sent.
type upgrading struct {
	agentrunner.Agent
	upgrade  atomic.Bool
	v1, v2   atomic.Int32
	mu       sync.Mutex
	mismatch []string
}

func (u *upgrading) Card() agentrunner.RoleCard {
	c := u.Agent.Card()
	c.Accepts = []string{contract.V1}
	if u.upgrade.Load() {
		c.Accepts = []string{contract.V1, contract.V2}
	}
	return c
}

func (u *upgrading) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	if in.V2 == nil {
		u.v1.Add(1)
		return u.Agent.Run(ctx, in)
	}
	u.v2.Add(1)
	back, err := contract.V2ToV1(in.V2)
	again, err2 := contract.V1ToV2(in.Package, in.V2.GetBudget().GetDeadline().AsTime())
	if err != nil || err2 != nil || !proto.Equal(back, in.Package) || !proto.Equal(again, in.V2) {
		u.mu.Lock()
		u.mismatch = append(u.mismatch, fmt.Sprintf("%s/%s: %v %v", in.Package.GetJobId(), in.Package.GetStage(), err, err2))
		u.mu.Unlock()
	}
	return u.Agent.Run(ctx, in)
}

// TestRollingUpgrade runs 100 jobs through support-ticket with draft served by the
// TypeScript runner (handoff.v1 only: it has no Describe) and judge by a Go agent whose
// runner is upgraded from v1 only to v1+v2 halfway through, jobs in flight. None is lost
// (every job completes), none is refused for its version (no REJECTED_SCHEMA at all), the
// judge is sent v1 before the upgrade and v2 after it, the TypeScript stage v1 throughout,
// and every converted package round-trips. On both stores.
func TestRollingUpgrade(t *testing.T) {
	node := requireNode(t)
	for _, name := range []string{"bbolt", "redis"} {
		t.Run(name, func(t *testing.T) {
			var s store.Store
			if name == "redis" {
				s = storetest.OpenRedis(t)
			}
			rollingUpgrade(t, node, s)
		})
	}
}

func rollingUpgrade(t *testing.T, node string, s store.Store) {
	const jobs, parallel = 100, 16
	dataDir := t.TempDir()
	ts := startRunner(t, node, filepath.Join(dataDir, "artifacts"))
	judge := &upgrading{Agent: support.NewJudge()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Config{
		DataDir: dataDir, Store: s,
		CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines:   map[string]*pipeline.Pipeline{"support-ticket": supportTicketVia(t, ts.addr)},
		Agents:      []agentrunner.Agent{support.NewIntake(), support.NewRetrieve(), judge},
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		DescribeTTL: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	coord := handoffv1.NewCoordinatorServiceClient(cc)

	type ended struct {
		job *handoffv1.Job
		evs []*handoffv1.JobEvent
		err error
	}
	out := make([]ended, jobs)
	var done atomic.Int32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range jobs {
		sem <- struct{}{}
		if i == jobs/2 {
			judge.upgrade.Store(true) // jobs before this one are still in flight
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i].job, out[i].evs, out[i].err = runTicket(ctx, coord, st.Artifacts, fmt.Sprintf("tkt_up_%03d", i))
			done.Add(1)
		}()
	}
	wg.Wait()

	sent := map[string]int{}
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("job %d: %v", i, o.err)
		}
		if o.job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Errorf("job %s ended %s: %v", o.job.GetJobId(), o.job.GetState(), o.job.GetEscalation())
		}
		for _, ev := range o.evs {
			switch ev.GetKind() {
			case handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT:
				sent[ev.GetStage()+":"+ev.GetSchema()]++
			case handoffv1.EventKind_EVENT_KIND_ACK:
				if ev.GetAck().GetStatus() == handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
					t.Errorf("job %s hop %d %s: REJECTED_SCHEMA %v", o.job.GetJobId(), ev.GetHop(), ev.GetStage(), ev.GetAck().GetReasons())
				}
			}
		}
	}
	t.Logf("packages sent by stage and version: %v; judge ran %d on v1, %d on v2", sent, judge.v1.Load(), judge.v2.Load())
	if sent["draft:"+contract.V2] != 0 || sent["draft:"+contract.V1] < jobs {
		t.Errorf("the TypeScript draft stage was sent %d v2 and %d v1 packages; want v1 only, at least one per job", sent["draft:"+contract.V2], sent["draft:"+contract.V1])
	}
	if sent["judge:"+contract.V1] == 0 || sent["judge:"+contract.V2] == 0 || judge.v2.Load() == 0 {
		t.Errorf("judge was sent %d v1 and %d v2 packages: want both, v1 before the upgrade and v2 after", sent["judge:"+contract.V1], sent["judge:"+contract.V2])
	}
	judge.mu.Lock()
	defer judge.mu.Unlock()
	if len(judge.mismatch) > 0 {
		t.Errorf("%d converted packages did not round-trip: %v", len(judge.mismatch), judge.mismatch)
	}
}

// runTicket submits the sample ticket as jobID and waits for its run to end.
func runTicket(ctx context.Context, coord handoffv1.CoordinatorServiceClient, arts artifact.Store, jobID string) (*handoffv1.Job, []*handoffv1.JobEvent, error) {
	input, err := arts.Put(ctx, artifact.Ref{JobID: jobID, Stage: "submit", Type: support.TypeRawTicket, SchemaVersion: support.SchemaRawTicket, MediaType: support.MediaJSON}, support.SampleTicket())
	if err != nil {
		return nil, nil, err
	}
	resp, err := coord.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		JobId: jobID, Pipeline: "support-ticket", Goal: demo.Goal, Constraints: demo.Constraints,
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_200_000}, Inputs: []*handoffv1.Artifact{input}, MemoryRefs: []string{"customer_id:cus_9"},
	})
	if err != nil {
		return nil, nil, err
	}
	evs, err := demo.Watch(ctx, coord, resp.GetJob().GetRunId(), nil)
	if err != nil {
		return nil, nil, err
	}
	got, err := coord.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
	if err != nil {
		return nil, nil, err
	}
	return got.GetJob(), evs, nil
}
