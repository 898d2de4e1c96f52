package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// JobsPipeline is the name of figure J's pipeline: five agent stages served by Noop agents,
// no judge and no writeback, so it measures the rail itself.
const JobsPipeline = "bench-noop-5"

const jobsPipelineYAML = `name: bench-noop-5
description: five no-op stages, to measure what the rail itself costs per job
max_hops: 10
max_revisions: 0
escalation: {route: bench}
tools: []
stages:
  - {name: s1, input: bench_in.v1, output: {type: s1_out, schema_version: s1_out.v1}, tools: [], criteria: [c1]}
  - {name: s2, input: s1_out.v1, output: {type: s2_out, schema_version: s2_out.v1}, tools: [], criteria: [c2]}
  - {name: s3, input: s2_out.v1, output: {type: s3_out, schema_version: s3_out.v1}, tools: [], criteria: [c3]}
  - {name: s4, input: s3_out.v1, output: {type: s4_out, schema_version: s4_out.v1}, tools: [], criteria: [c4]}
  - {name: s5, input: s4_out.v1, output: {type: s5_out, schema_version: s5_out.v1}, tools: [], criteria: [c5]}
`

func jobsPipelines() (map[string]*pipeline.Pipeline, []agentrunner.Agent, error) {
	p, problems, err := pipeline.Parse("bench-noop-5.yaml", []byte(jobsPipelineYAML))
	if err != nil {
		return nil, nil, err
	}
	if pipeline.HasErrors(problems) {
		return nil, nil, &pipeline.Error{File: "bench-noop-5.yaml", Problems: problems}
	}
	var agents []agentrunner.Agent
	for _, st := range p.Stages {
		agents = append(agents, agentrunner.NewNoop(st.AgentName()))
	}
	pipes := map[string]*pipeline.Pipeline{p.Name: p}
	if agents, err = addFanout(pipes, agents); err != nil { // figure J_fanout's (fanout.go)
		return nil, nil, err
	}
	return pipes, agents, nil
}

// JobsConfig configures RunJobs.
type JobsConfig struct {
	// N jobs are run (after one warm-up job that is not counted), Concurrency at a time
	// (default 1).
	N, Concurrency int
	// Store is "bolt" (stack.Start: the embedded store in a temporary folder, exactly what
	// `handoff up` runs) or "redis" (the same three services on store.OpenRedis with a
	// unique key prefix, deleted afterwards).
	Store string
	// RedisAddr for Store "redis"; default DefaultRedisAddr.
	RedisAddr string
	// Logger of the services; default JSON warnings to io.Discard.
	Logger *slog.Logger
}

// JobsResult is what RunJobs measured: per-job latency from SubmitJob until WatchJob
// reports the run COMPLETED (under Concurrency jobs in flight), completed jobs per second
// of wall time, and the CPU a job took.
type JobsResult struct {
	P50, P99   time.Duration
	JobsPerSec float64
	// CPU per job over the N jobs (not the warm-up): this process's (getrusage: every
	// service and the client run in it, and whatever else the caller runs meanwhile) plus,
	// on Store "redis", the Redis server's (INFO cpu deltas, all its clients), which
	// CPURedis is alone (0 on any other store; StoreCluster's masters are not read).
	CPU, CPURedis time.Duration
}

// RunJobs starts a platform on cfg.Store, runs cfg.N five-stage Noop jobs through its
// coordinator with cfg.Concurrency in flight, stops the platform and reports. Any job that
// does not end COMPLETED is an error.
func RunJobs(ctx context.Context, cfg JobsConfig) (JobsResult, error) {
	if cfg.N <= 0 {
		return JobsResult{}, errors.New("bench: JobsConfig.N must be positive")
	}
	rig, err := newJobsRig(ctx, cfg.Store, cfg.RedisAddr, "", cfg.Logger)
	if err != nil {
		return JobsResult{}, err
	}
	defer rig.close()
	if err := rig.job(ctx, 0); err != nil { // warm-up: connections, buckets, scripts
		return JobsResult{}, err
	}
	var rdb *redis.Client // the store's Redis, for its CPU
	if cfg.Store == StoreRedis {
		addr := cmp.Or(cfg.RedisAddr, DefaultRedisAddr)
		if rdb, err = newRedis(ctx, addr); err != nil {
			return JobsResult{}, err
		}
		defer rdb.Close()
	}
	var r0, r1 time.Duration
	if rdb != nil {
		if r0, err = redisCPU(ctx, rdb); err != nil {
			return JobsResult{}, fmt.Errorf("bench: Redis CPU: %w", err)
		}
	}
	p0 := processCPU()
	lat, elapsed, err := RunN(ctx, cfg.N, max(cfg.Concurrency, 1), rig.job)
	if err != nil {
		return JobsResult{}, err
	}
	p1 := processCPU()
	if rdb != nil {
		if r1, err = redisCPU(ctx, rdb); err != nil {
			return JobsResult{}, fmt.Errorf("bench: Redis CPU: %w", err)
		}
	}
	p50, p99 := quantiles(lat)
	n := time.Duration(cfg.N)
	return JobsResult{P50: p50, P99: p99, JobsPerSec: float64(cfg.N) / elapsed.Seconds(),
		CPU: (max(p1-p0, 0) + max(r1-r0, 0)) / n, CPURedis: max(r1-r0, 0) / n}, nil
}

// RunN runs op n times with conc in flight (op gets its worker's index); it returns every
// latency and the wall time. The first error stops that worker and is returned.
func RunN(ctx context.Context, n, conc int, op func(context.Context, int) error) ([]time.Duration, time.Duration, error) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				t := time.Now()
				if err := op(ctx, w); err != nil {
					errs[w] = err
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return lat, elapsed, nil
}

// jobsRig is a running platform with figure J's pipeline and a coordinator client.
type jobsRig struct {
	client handoffv1.CoordinatorServiceClient
	// missedEnd counts watches that ended before the terminal event was streamed (the run's
	// state was COMPLETED all the same): see job.
	missedEnd atomic.Int64
	closers   []func()
	jobPrefix string
	seq       atomic.Uint64
	// pipeline is the pipeline each job runs: JobsPipeline, RoutesPipeline, or FanoutPipeline
	// for J_fanout.
	pipeline string
}

// newJobsRig starts a platform on store kind; its files go in a new folder under baseDir
// ("" = os.TempDir()).
func newJobsRig(ctx context.Context, kind, redisAddr, baseDir string, log *slog.Logger) (_ *jobsRig, err error) {
	return newJobsRigFor(ctx, JobsPipeline, kind, redisAddr, baseDir, log)
}

// newJobsRigFor is newJobsRig running pipeline (JobsPipeline or RoutesPipeline).
func newJobsRigFor(ctx context.Context, pipe, kind, redisAddr, baseDir string, log *slog.Logger) (_ *jobsRig, err error) {
	if log == nil {
		log = quietLogger()
	}
	build := jobsPipelines
	if pipe == RoutesPipeline {
		build = routesPipelines
	}
	pipes, agents, err := build()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(baseDir, "handoff-bench-jobs-")
	if err != nil {
		return nil, err
	}
	r := &jobsRig{jobPrefix: "job-" + randomHex(4), pipeline: pipe}
	r.closers = append(r.closers, func() { os.RemoveAll(dir) })
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	cfg := stack.Config{
		DataDir: dir, CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: pipes, Agents: agents, Logger: log,
	}
	switch kind {
	case StoreBolt:
	case StoreRedis:
		if redisAddr == "" {
			redisAddr = DefaultRedisAddr
		}
		prefix := newPrefix("jobs")
		rs, err := store.OpenRedis(ctx, store.RedisOptions{Addr: redisAddr, Prefix: prefix})
		if err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() {
			rs.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			deletePrefix(ctx, redisAddr, prefix)
			cancel()
		})
		cfg.Store = rs
	case StoreCluster: // redisAddr: the nodes, comma-separated
		prefix := newPrefix("jobs")
		addrs := strings.Split(redisAddr, ",")
		rs, err := store.OpenRedis(ctx, store.RedisOptions{Cluster: addrs, Prefix: prefix})
		if err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() {
			rs.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			deleteClusterPrefix(ctx, addrs, prefix)
			cancel()
		})
		cfg.Store = rs
	default:
		return nil, fmt.Errorf("bench: unknown store %q (want %q, %q or %q)", kind, StoreBolt, StoreRedis, StoreCluster)
	}
	st, err := stack.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		return nil, err
	}
	r.client = handoffv1.NewCoordinatorServiceClient(cc)
	return r, nil
}

// job is one five-stage job: SubmitJob, then WatchJob until the stream ends; the run must
// end COMPLETED. When the stream ends without the terminal event (the coordinator's
// WatchJob can return between finish saving the terminal state and appending its event),
// the run's state decides, with GetJob, and the miss is counted.
func (r *jobsRig) job(ctx context.Context, _ int) error {
	id := fmt.Sprintf("%s-%d", r.jobPrefix, r.seq.Add(1))
	resp, err := r.client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		JobId: id, Pipeline: r.pipeline, Goal: "measure the rail", Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000},
	})
	if err != nil {
		return fmt.Errorf("submit %s: %w", id, err)
	}
	evs, err := demo.Watch(ctx, r.client, resp.GetJob().GetRunId(), nil)
	if err != nil {
		return err
	}
	if n := len(evs); n > 0 && evs[n-1].GetKind() == handoffv1.EventKind_EVENT_KIND_COMPLETED {
		return nil
	}
	got, err := r.client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
	if err != nil {
		return fmt.Errorf("job %s: watch ended without the terminal event; get: %w", id, err)
	}
	if job := got.GetJob(); job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		return fmt.Errorf("job %s ended %s at %s: %s", id, job.GetState(), job.GetStage(), job.GetEscalation().GetDetail())
	}
	r.missedEnd.Add(1)
	return nil
}

func (r *jobsRig) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}
