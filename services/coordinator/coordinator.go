// Package coordinator is the rail: deterministic code (never a model) that owns each job
// run's state transitions, its one wallet, its hop count, the routes it allows, the critique
// loop, the writeback gate and escalation. It builds every package from the run's durable
// state, sends it to an agent runner or the writeback service, and records the outcome before
// the next hop. The rules of a step are one pure function (next, rules.go); the driver
// (driver.go) sends, debits and saves what it decides.
package coordinator

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/traceparent"
)

// Options configure a Server. Store, Pipelines, Runner and Writeback are required.
type Options struct {
	Store     store.Store
	Pipelines map[string]*pipeline.Pipeline
	// Runner is the agent runner for stages that name no runner address of their own.
	Runner handoffv1.AgentRunnerServiceClient
	// Dial connects to a stage's own runner address (pipeline `runner:`). Nil: such
	// pipelines are refused at start.
	Dial func(addr string) (grpc.ClientConnInterface, error)
	// Writeback is the only writer; the coordinator calls it only after a judge's PASS.
	Writeback handoffv1.WritebackServiceClient
	Validator *contract.Validator
	Logger    *slog.Logger
	// HopTimeout bounds one hop (ack plus stage result). Default 2m.
	HopTimeout time.Duration
	// Retry is how often a hop is retried when the peer is unreachable or answers Aborted
	// (the stage or write is in flight elsewhere), with backoff. Default 8.
	Retry int
	// RetryFor keeps a hop retrying past Retry attempts until this long has passed since its
	// first attempt. A peer that crashed mid-hop leaves the hop's idempotency claim pending
	// until its TTL lapses (the agent runner's is 3s, renewed while its agent works; the
	// writeback's pending TTL is 2m), and every attempt before then is answered Aborted: a
	// hop gives up, failing or escalating its run, only after that window. Default 3m.
	RetryFor time.Duration
	// Owner names this replica in the run leases (see Resume); default hostname/pid/random,
	// unique per process, so a restarted replica never mistakes a lease of its former self
	// for its own.
	Owner string
	// LeaseTTL is how long a run's lease outlives its holder's last renewal: a replica that
	// dies is replaced on its runs within about LeaseTTL (plus LeaseTTL/10 for the next
	// poll of lapsed leases). The holder renews every LeaseTTL/3 (and before a hop when it
	// has not for that long), and stops driving when it cannot renew for LeaseTTL/2.
	// Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// ClaimTTL is how long an operator's claim of an escalation lasts (ClaimEscalation);
	// claiming again renews it. Default DefaultClaimTTL.
	ClaimTTL time.Duration
	// EscalationWebhook is POSTed each escalation of a pipeline that names no
	// escalation.webhook of its own ("" and none: no delivery).
	EscalationWebhook string
	// DeskURL is the operator page's base URL, for the link in a webhook's body.
	DeskURL string
	// HTTPClient delivers webhooks (default: one with a 10 s timeout).
	HTTPClient *http.Client
	// WebhookAttempts bounds the tries of one delivery (default 5); WebhookBackoff is the
	// wait before the second, doubling after (default 200ms).
	WebhookAttempts int
	WebhookBackoff  time.Duration
	// DrainTimeout bounds how long Close waits for the drivers to finish the hop each has in
	// flight before it cancels them. Default 30s.
	DrainTimeout time.Duration
	// Tamper, when set, may modify each package right before it is sent. Fault injection
	// for tests and the chaos harness only; never set in production.
	Tamper func(*handoffv1.HandoffPackage)
	Now    func() time.Time
	// TracerProvider starts the job's spans: one per hop the coordinator sends, parent of
	// the receiver's ack span. A no-op provider falls back to bare traceparents.
	TracerProvider oteltrace.TracerProvider
	// Artifacts stores the artifact versions a person edits when resolving an escalation
	// (and reads the proposed artifact for the operator page). Optional: without it,
	// ResolveEscalation refuses edits.
	Artifacts artifact.Store
	// OperatorToken, when set, is required by ListEscalations and ResolveEscalation (and the
	// operator web page) as `authorization: Bearer <token>`. Empty: those are open to
	// anyone who can call the coordinator.
	OperatorToken string
	// DescribeTTL is how long a runner's declared versions (Describe) are trusted before
	// the rail asks again. Default 5s.
	DescribeTTL time.Duration
	// DefaultDeadline is the deadline of a job submitted without one, from its submit.
	// Default 24h.
	DefaultDeadline time.Duration
	// PIIVault keeps the personal data a pipeline with pii.policy redact takes out of a job
	// (see pii.go). Required when a pipeline redacts.
	PIIVault pii.Keeper
}

// Server implements handoffv1.CoordinatorServiceServer.
type Server struct {
	handoffv1.UnimplementedCoordinatorServiceServer

	opts    Options
	log     *slog.Logger
	tracer  oteltrace.Tracer
	runners map[string]handoffv1.AgentRunnerServiceClient // by address; "" = default
	decl    *declarations                                 // what each runner accepts

	mu      sync.Mutex
	driving map[string]bool                  // run ids with a live driver in this process
	feeds   map[string]*feed                 // runs watched here: the events this process wrote
	pending map[string][]*handoffv1.JobEvent // events waiting for their run's next save (later)
	carried map[string]bool                  // runs whose last move waits for the next package sent (carry)

	wg         sync.WaitGroup
	ctx        context.Context // cancelled when Close gives up draining
	cancel     context.CancelFunc
	stopping   chan struct{} // closed when Close starts: no new drivers, none starts a new hop
	stopOnce   sync.Once
	scanOnce   sync.Once
	scanEvery  time.Duration // the backstop scan of RUNNING runs
	watchEvery time.Duration // the poll of lapsed leases

	pii map[string]*pii.Detector // each pipeline's personal-data detector, by pipeline name
}

// DefaultLeaseTTL is Options.LeaseTTL's default: short, so a dead replica's runs resume
// elsewhere in about a second and a half. Each run in flight costs its store about three
// lease renewals a second (two Redis commands each: the lease and its index entry).
const DefaultLeaseTTL = 1500 * time.Millisecond

// New checks the options and returns a Server. Call Resume to pick up runs left in flight.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Runner == nil || opts.Writeback == nil || opts.Validator == nil {
		return nil, errors.New("coordinator: Store, Runner, Writeback and Validator are required")
	}
	if len(opts.Pipelines) == 0 {
		return nil, errors.New("coordinator: no pipelines loaded")
	}
	// Each pipeline was linted alone; what a sub-job stage names is checked across the set
	// (a missing pipeline, pipelines that run each other), however the set was loaded.
	if problems := pipeline.CheckSubJobs(opts.Pipelines); pipeline.HasErrors(problems) {
		return nil, fmt.Errorf("coordinator: %w", &pipeline.Error{File: "pipelines", Problems: problems})
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HopTimeout <= 0 {
		opts.HopTimeout = 2 * time.Minute
	}
	if opts.Retry <= 0 {
		opts.Retry = 8
	}
	if opts.RetryFor <= 0 {
		opts.RetryFor = 3 * time.Minute
	}
	if opts.Owner == "" {
		opts.Owner = defaultOwner()
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.WebhookAttempts <= 0 {
		opts.WebhookAttempts = 5
	}
	if opts.WebhookBackoff <= 0 {
		opts.WebhookBackoff = 200 * time.Millisecond
	}
	if opts.ClaimTTL <= 0 {
		opts.ClaimTTL = DefaultClaimTTL
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	if opts.DescribeTTL <= 0 {
		opts.DescribeTTL = defaultDescribeTTL
	}
	if opts.DefaultDeadline <= 0 {
		opts.DefaultDeadline = 24 * time.Hour
	}
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		tracer:  opts.TracerProvider.Tracer("github.com/handoffhq/handoff/services/coordinator"),
		runners: map[string]handoffv1.AgentRunnerServiceClient{"": opts.Runner},
		decl:    &declarations{ttl: opts.DescribeTTL, now: opts.Now, byRn: map[string]declaration{}},
		driving: map[string]bool{},
		feeds:   map[string]*feed{},
		pending: map[string][]*handoffv1.JobEvent{},
		carried: map[string]bool{},

		stopping:   make(chan struct{}),
		scanEvery:  max(10*opts.LeaseTTL, 10*time.Second),
		watchEvery: min(max(opts.LeaseTTL/10, 10*time.Millisecond), 250*time.Millisecond),
	}
	for _, p := range opts.Pipelines {
		for _, st := range p.Stages {
			if st.Runner == "" || s.runners[st.Runner] != nil {
				continue
			}
			if opts.Dial == nil {
				return nil, fmt.Errorf("coordinator: pipeline %s stage %s names runner %s but no Dial is configured", p.Name, st.Name, st.Runner)
			}
			cc, err := opts.Dial(st.Runner)
			if err != nil {
				return nil, fmt.Errorf("coordinator: pipeline %s stage %s: dial runner %s: %w", p.Name, st.Name, st.Runner, err)
			}
			s.runners[st.Runner] = handoffv1.NewAgentRunnerServiceClient(cc)
		}
	}
	if err := s.piiSetup(); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Register adds the coordinator to a gRPC server.
func Register(g *grpc.Server, s *Server) { handoffv1.RegisterCoordinatorServiceServer(g, s) }

// Interceptors are the coordinator's enforcement step of the chain (internal/rpc): every
// request is validated before a handler reads it.
func (s *Server) Interceptors() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	return []grpc.UnaryServerInterceptor{validate.UnaryServerInterceptor(s.opts.Validator)},
		[]grpc.StreamServerInterceptor{validate.StreamServerInterceptor(s.opts.Validator,
			validate.WithStreamRequest(handoffv1.CoordinatorService_WatchJob_FullMethodName, func() proto.Message { return &handoffv1.WatchJobRequest{} }))}
}

// Close drains the coordinator: no driver starts and none begins a new hop; each finishes
// the hop it has in flight (up to DrainTimeout, after which it is cancelled) and releases its
// run's lease, so another replica takes the run over at its next scan instead of after the
// lease expires. Runs left RUNNING stay so in the store.
func (s *Server) Close() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		close(s.stopping)
		s.mu.Unlock()
	})
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.opts.DrainTimeout):
		s.log.Warn("drain timed out; cancelling the hops still in flight (their runs are taken over and the hops re-sent)", "drain_timeout", s.opts.DrainTimeout.String())
	}
	s.cancel()
	<-done
}

// Owner is this replica's name in the run leases.
func (s *Server) Owner() string { return s.opts.Owner }

// stopped reports whether Close has started.
func (s *Server) stopped() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// newRunID is "run_", 12 hex digits of the creation time in Unix milliseconds, then 16
// random hex digits. The random part keeps ids unguessable and unique (64 bits, as before
// the time came first); the time makes them sort by creation. That order is for the
// embedded store: the runs, their events, wallets, leases and fences are all keyed by run
// id, and with random ids the jobs in flight landed on as many B+tree leaves as there
// were jobs, each read, copied and written again on every commit. With time-ordered ids
// they share the newest leaves: 8-12 % more jobs/s and 5-8 % less CPU per job on bbolt at 32
// in flight (bench/README.md, "Issue 22, sixth round").
func newRunID() string { return runIDAt(time.Now()) }

func runIDAt(t time.Time) string {
	var b [14]byte
	binary.BigEndian.PutUint64(b[:8], uint64(t.UnixMilli())<<16) // the time in b[:6]
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err)
	}
	return "run_" + hex.EncodeToString(b[:])
}

func (s *Server) pipelineNames() string {
	names := make([]string, 0, len(s.opts.Pipelines))
	for n := range s.opts.Pipelines {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// SubmitJob creates a run and starts driving it. Inputs must be in the job's own artifact
// folder or carry a sha256 (InvalidArgument naming the input otherwise). A job_id already
// submitted with other content is AlreadyExists, a request_id used for a different request
// FailedPrecondition (createRunErr); the same request again returns its run, the same job
// content under a new request starts a repeat run.
func (s *Server) SubmitJob(ctx context.Context, req *handoffv1.SubmitJobRequest) (*handoffv1.SubmitJobResponse, error) {
	p, ok := s.opts.Pipelines[req.GetPipeline()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pipeline %q is not loaded (loaded: %s)", req.GetPipeline(), s.pipelineNames())
	}
	if tp := req.GetTrace().GetTraceparent(); tp != "" && !traceparent.Valid(tp) {
		return nil, status.Errorf(codes.InvalidArgument, "invalid request: trace.traceparent %q is not a valid W3C traceparent", tp)
	}
	if field, why := inputsProblem(s.artifactRoot(), req.GetJobId(), req.GetInputs()); field != "" {
		return nil, fieldError(codes.InvalidArgument, field, why)
	}
	req, err := s.piiSubmit(ctx, p, req)
	if err != nil {
		return nil, err
	}
	deadline := req.GetDeadline()
	if deadline == nil {
		deadline = timestamppb.New(s.opts.Now().Add(s.opts.DefaultDeadline))
	} else if !deadline.AsTime().After(s.opts.Now()) {
		return nil, fieldError(codes.InvalidArgument, "deadline", fmt.Sprintf("%s is not in the future: a job must be submitted before its deadline", deadline.AsTime().UTC().Format(time.RFC3339)))
	}
	full, why, err := s.deskFull(ctx, p)
	if err != nil {
		return nil, err
	}
	human := full && p.Escalation.WhenFull == pipeline.WhenFullHuman
	if full && !human {
		return nil, shed(why)
	}
	runID := newRunID()
	wallet := proto.Clone(req.GetBudget()).(*handoffv1.Budget)
	wallet.WalletId = runID // the rail's: a caller does not choose the wallet its job pays from
	if wallet.GetHopsRemaining() == 0 {
		wallet.HopsRemaining = uint32(p.MaxHops)
	}
	if wallet.GetRevisionsRemaining() == 0 {
		wallet.RevisionsRemaining = uint32(p.MaxRevisions)
	}
	tp := req.GetTrace().GetTraceparent()
	if tp == "" {
		// The job's trace starts here (under the caller's gRPC trace when it sent one).
		sctx, span := s.tracer.Start(ctx, "handoff.submit "+req.GetJobId())
		span.End()
		if tp = hoptrace.Format(sctx); tp == "" {
			tp = traceparent.New()
		}
	}
	now := timestamppb.New(s.opts.Now())
	job := &handoffv1.Job{
		RunId:       runID,
		JobId:       req.GetJobId(),
		Pipeline:    p.Name,
		State:       handoffv1.JobState_JOB_STATE_RUNNING,
		Goal:        req.GetGoal(),
		Constraints: req.GetConstraints(),
		Wallet:      wallet,
		Stage:       p.First().Name,
		Artifacts:   req.GetInputs(),
		MemoryRefs:  req.GetMemoryRefs(),
		Traceparent: tp,
		Tracestate:  req.GetTrace().GetTracestate(),
		CreatedAt:   now,
		UpdatedAt:   now,
		RequestId:   req.GetRequestId(),
		Deadline:    deadline,
	}
	if s.stopped() {
		return nil, status.Error(codes.Unavailable, "coordinator is shutting down; submit to another replica or retry")
	}
	// The run, its wallet and its SUBMITTED event in one write, which also refuses a job_id
	// or request_id reused for other content.
	submitted := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED, Stage: job.GetStage()}
	s.stamp(job, submitted)
	if human {
		return s.submitToPerson(ctx, p, job, req, submitted, why)
	}
	// On a store that can (store.RunLeaser) the same write takes the new run's lease and
	// its first epoch, for the driver started below: one write fewer on every job's path.
	var (
		run     *handoffv1.Job
		created bool
		epoch   uint64
		took    time.Time
	)
	if rl, ok := s.opts.Store.(store.RunLeaser); ok {
		took = time.Now()
		run, created, epoch, err = rl.CreateRunLeased(ctx, job, store.LeaseClaim{Name: leaseName(runID), Owner: s.opts.Owner, TTL: s.opts.LeaseTTL}, submitted)
	} else {
		run, created, err = s.opts.Store.CreateRun(ctx, job, submitted)
	}
	if err != nil {
		return nil, createRunErr(err, req)
	}
	if !created {
		return &handoffv1.SubmitJobResponse{Job: run, Existing: true}, nil
	}
	s.keepFeed(run.GetRunId()) // until its driver ends (drive), or now if none starts
	s.published(run.GetRunId(), []*handoffv1.JobEvent{submitted})
	if s.log.Enabled(ctx, slog.LevelInfo) { // built only when written: every job passes here
		s.log.Info("job submitted", "run_id", run.GetRunId(), "job_id", run.GetJobId(), "pipeline", p.Name, "trace_id", traceparent.TraceID(tp))
	}
	// The driver starts from the run just written (and its wallet, opened with it) rather
	// than reading both back: job itself, which the store did not keep (run, the answer,
	// is the store's copy, sent to the caller while the driver changes job), unless the
	// store created the run under another id (finishing an earlier creation of the same
	// request): then from a copy of what it wrote.
	start := job
	if run.GetRunId() != job.GetRunId() {
		start = proto.Clone(run).(*handoffv1.Job)
	}
	s.setWallet(start, start.GetWallet())
	var started bool
	if epoch > 0 && run.GetRunId() == job.GetRunId() { // a RunLeaser creates the run under job's id
		if started, err = s.driveLeased(ctx, run.GetRunId(), epoch, took, start); err != nil {
			s.log.Warn("shutting down: could not give back the new run's lease; it lapses and another replica drives the run", "run_id", run.GetRunId(), "err", err)
		}
	} else { // no lease taken with the run: no RunLeaser, another owner held it, or the store could not take it with the run
		if started, err = s.drive(ctx, run.GetRunId(), start); err != nil {
			s.log.Warn("could not take the new run's lease; the takeover scan will drive it", "run_id", run.GetRunId(), "err", err)
		}
	}
	if !started {
		s.unkeepFeed(run.GetRunId())
	}
	return &handoffv1.SubmitJobResponse{Job: run}, nil
}

func (s *Server) GetJob(ctx context.Context, req *handoffv1.GetJobRequest) (*handoffv1.GetJobResponse, error) {
	job, err := s.opts.Store.GetRun(ctx, req.GetRunId())
	if err != nil {
		return nil, storeErr(err, req.GetRunId())
	}
	tl, err := s.timelineOf(ctx, req.GetRunId())
	if err != nil {
		return nil, storeErr(err, req.GetRunId())
	}
	return &handoffv1.GetJobResponse{Job: job, Timeline: tl}, nil
}

func storeErr(err error, runID string) error {
	if errors.Is(err, store.ErrNotFound) {
		return status.Errorf(codes.NotFound, "run %q not found", runID)
	}
	return status.Errorf(codes.Unavailable, "store: %v", err)
}

func (s *Server) ListJobs(ctx context.Context, req *handoffv1.ListJobsRequest) (*handoffv1.ListJobsResponse, error) {
	size := int(req.GetPageSize())
	if size == 0 {
		size = 50
	}
	runs, next, err := s.opts.Store.ListRuns(ctx, req.GetState(), size, req.GetPageToken())
	if err != nil {
		if strings.Contains(err.Error(), "page token") {
			return nil, status.Errorf(codes.InvalidArgument, "invalid request: page_token: %v", err)
		}
		return nil, status.Errorf(codes.Unavailable, "store: %v", err)
	}
	return &handoffv1.ListJobsResponse{Jobs: runs, NextPageToken: next}, nil
}

// WatchJob sends the run's events from after_seq on, then live ones, and returns once the
// run has reached a terminal state and every event was sent.
func (s *Server) WatchJob(req *handoffv1.WatchJobRequest, stream grpc.ServerStreamingServer[handoffv1.WatchJobResponse]) error {
	ctx := stream.Context()
	after := req.GetAfterSeq()
	// A run's terminal event is saved with its terminal state; a run saved by an older
	// coordinator has it appended just after. So a watch that sees the state first waits
	// for the event (up to endGrace, in case the append failed) rather than end without it.
	const endGrace = 2 * time.Second
	sawEnd, endBy := false, time.Time{}
	// wake gets a signal at each write of the run's events from here on: registered before
	// the first read, so an event written after any read leaves a signal for the next.
	wake, stop := s.watchFeed(req.GetRunId())
	defer stop()
	poll := time.NewTimer(watchPoll) // one timer for the whole watch, reset at every wait but a stale one
	defer poll.Stop()
	woken := false // the last wait ended with a signal from the feed
	for {
		// Events this process wrote come from the feed; the first read, a watcher that fell
		// behind, and a poll for other processes' writes go to the store. A signal for
		// events this watch has sent already (two writes before one read) needs neither
		// the store nor the run: the poll still reads both while the timeline is quiet.
		evs, ok := s.fed(req.GetRunId(), after)
		stale := !ok && woken && s.caughtUp(req.GetRunId(), after)
		if !ok && !stale {
			var err error
			if evs, err = s.opts.Store.Events(ctx, req.GetRunId(), after); err != nil {
				return storeErr(err, req.GetRunId())
			}
		}
		for _, ev := range evs {
			if err := stream.Send(&handoffv1.WatchJobResponse{Event: ev}); err != nil {
				return err
			}
			after = ev.GetSeq()
			sawEnd = sawEnd || terminalEvent(ev.GetKind())
		}
		if n := len(evs); n > 0 && terminalEvent(evs[n-1].GetKind()) {
			// The newest event ends the run: the run was in that terminal state when it was
			// written (the coordinator writes the two together, or the state first), and
			// nothing came after it.
			return nil
		}
		if len(evs) == 0 && !stale {
			// Only a quiet timeline needs the run itself (has it ended?): reading it for
			// every batch of events doubled a watch's store reads.
			if done, err := s.watchEnded(ctx, req.GetRunId(), after, sawEnd, &endBy, endGrace); err != nil || done {
				return err
			}
		}
		if !stale {
			// A wake that read nothing leaves the poll running: wakes for writes here that
			// added nothing (every append failed) would otherwise put off, for as long as
			// they come, the store read that finds other processes' events.
			poll.Reset(watchPoll)
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopping:
			return status.Error(codes.Unavailable, "coordinator is shutting down; watch again with after_seq to resume")
		case <-wake:
			woken = true
		case <-poll.C: // runs driven by another process
			woken = false
		}
	}
}

// watchEnded reports whether a watch whose timeline is quiet after seq after can end: the
// run is terminal and its terminal event was sent (or, resumed after it, is at after), or
// endGrace passed since the state was seen without the event.
func (s *Server) watchEnded(ctx context.Context, runID string, after uint64, sawEnd bool, endBy *time.Time, endGrace time.Duration) (bool, error) {
	job, err := s.opts.Store.GetRun(ctx, runID)
	if err != nil {
		return false, storeErr(err, runID)
	}
	if !terminal(job.GetState()) {
		return false, nil
	}
	if sawEnd || (!endBy.IsZero() && time.Now().After(*endBy)) {
		return true, nil
	}
	if endBy.IsZero() {
		if s.endedAt(ctx, runID, after) {
			return true, nil // resumed after the terminal event
		}
		*endBy = time.Now().Add(endGrace)
	}
	return false, nil
}

func terminalEvent(k handoffv1.EventKind) bool {
	switch k {
	case handoffv1.EventKind_EVENT_KIND_COMPLETED, handoffv1.EventKind_EVENT_KIND_ESCALATED, handoffv1.EventKind_EVENT_KIND_FAILED:
		return true
	}
	return false
}

// endedAt reports whether the run's event seq is its terminal event.
func (s *Server) endedAt(ctx context.Context, runID string, seq uint64) bool {
	if seq == 0 {
		return false
	}
	evs, err := s.opts.Store.Events(ctx, runID, seq-1)
	return err == nil && len(evs) > 0 && evs[0].GetSeq() == seq && terminalEvent(evs[0].GetKind())
}

func terminal(st handoffv1.JobState) bool {
	switch st {
	case handoffv1.JobState_JOB_STATE_COMPLETED, handoffv1.JobState_JOB_STATE_ESCALATED, handoffv1.JobState_JOB_STATE_FAILED:
		return true
	}
	return false
}

// watchPoll is how often a watch reads the store while its run is quiet here, for events
// other processes write.
const watchPoll = 500 * time.Millisecond

// feedCap bounds a feed: a watcher further behind reads the store.
const feedCap = 256

// keptCap bounds a feed kept for a run submitted here that nobody watches yet (keepFeed):
// its first events, for the watch that usually follows the submit at once.
const keptCap = 8

// feed holds, for a run with watchers in this process (WatchJob), the latest events this
// process wrote to its timeline, in seq order, so a watch of a run driven here reads the
// store only to start, to catch up, and to notice other processes' writes (the poll),
// instead of once per event.
type feed struct {
	wakes []chan struct{} // one per watcher, buffered: a pending signal is not lost
	evs   []*handoffv1.JobEvent
	// unnumbered: events without a seq were written, which only the store has.
	unnumbered bool
	// kept: the run was submitted here and its first driver runs, so the feed collects
	// (up to keptCap events while unwatched) before any watch: the watch a caller opens
	// right after SubmitJob then starts from memory, not from a store read.
	kept bool
}

// keepFeed makes the feed of runID, just created here, collect its events before anyone
// watches it, until unkeepFeed.
func (s *Server) keepFeed(runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.feeds[runID]
	if !ok {
		f = &feed{}
		s.feeds[runID] = f
	}
	f.kept = true
}

// unkeepFeed ends keepFeed: the feed lives on only while watched.
func (s *Server) unkeepFeed(runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.feeds[runID]; ok {
		if f.kept = false; len(f.wakes) == 0 {
			delete(s.feeds, runID)
		}
	}
}

// watchFeed makes the run's feed collect events for one more watcher, whose channel wake
// then gets a signal after each write of the run's events (one waits at most: signals
// before the watcher reads again are one); stop ends that.
func (s *Server) watchFeed(runID string) (wake <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	f, ok := s.feeds[runID]
	if !ok {
		f = &feed{}
		s.feeds[runID] = f
	}
	f.wakes = append(f.wakes, ch)
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if f.wakes = slices.DeleteFunc(f.wakes, func(c chan struct{}) bool { return c == ch }); len(f.wakes) == 0 {
			if !f.kept {
				delete(s.feeds, runID)
			} else if n := len(f.evs) - keptCap; n > 0 {
				f.evs = slices.Delete(f.evs, 0, n)
			}
		}
	}
}

// published wakes the run's watchers after evs were written, handing the events to its feed
// when it has one. Events without a seq (a store that did not number them) are not fed:
// the watchers then read them from the store. The feed keeps evs themselves, which its
// watchers send while the driver goes on: an event is never modified once written (every
// caller builds its events for one write, and the driver replaces what it changes in the
// run, e.g. setWallet, withStaleFailure, instead of changing what an event may share).
func (s *Server) published(runID string, evs []*handoffv1.JobEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.feeds[runID]
	if !ok {
		return // nobody watches the run here
	}
	for _, ev := range evs {
		if ev.GetSeq() == 0 {
			f.unnumbered = true
			continue
		}
		// Writes of one run are sequential, so an event almost always goes last; the
		// search only keeps the feed ordered if one does not.
		i := len(f.evs)
		for i > 0 && f.evs[i-1].GetSeq() >= ev.GetSeq() {
			i--
		}
		if i < len(f.evs) && f.evs[i].GetSeq() == ev.GetSeq() {
			continue
		}
		f.evs = slices.Insert(f.evs, i, ev)
	}
	limit := feedCap
	if len(f.wakes) == 0 {
		limit = keptCap // kept, nobody watching yet
	}
	if n := len(f.evs) - limit; n > 0 {
		f.evs = slices.Delete(f.evs, 0, n)
	}
	for _, ch := range f.wakes {
		select {
		case ch <- struct{}{}:
		default: // a signal is waiting already
		}
	}
}

// fed returns the run's events after seq after from its feed, when the feed holds the next
// one (after+1) and those following it without a gap; ok is false otherwise, and the
// store has to be read.
func (s *Server) fed(runID string, after uint64) (evs []*handoffv1.JobEvent, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.feeds[runID]
	if f == nil {
		return nil, false
	}
	i, found := slices.BinarySearchFunc(f.evs, after+1, func(ev *handoffv1.JobEvent, seq uint64) int { return cmp.Compare(ev.GetSeq(), seq) })
	if !found {
		return nil, false
	}
	next := after + 1
	for _, ev := range f.evs[i:] {
		if ev.GetSeq() != next {
			break
		}
		evs = append(evs, ev)
		next++
	}
	return evs, true
}

// caughtUp reports whether a watcher that has sent the run's events up to seq after has
// every event this process wrote: the newest one in the feed is after, and the feed has
// missed none (unnumbered).
func (s *Server) caughtUp(runID string, after uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.feeds[runID]
	return f != nil && !f.unnumbered && len(f.evs) > 0 && f.evs[len(f.evs)-1].GetSeq() == after
}

// appendEvents appends evs to the run's timeline one by one and wakes its watchers. A failed
// append is logged: the run itself does not depend on its timeline.
func (s *Server) appendEvents(ctx context.Context, runID string, evs []*handoffv1.JobEvent) {
	written := evs[:0:0]
	for _, e := range evs {
		if _, err := s.opts.Store.AppendEvent(ctx, runID, e); err != nil {
			s.log.Error("append event", "run_id", runID, "kind", e.GetKind().String(), "err", err)
			continue
		}
		written = append(written, e)
	}
	s.published(runID, written)
}

// asyncEventLinger is how long an eventAsync write may wait for company (store.Linger).
const asyncEventLinger = time.Millisecond

// eventAsync appends an event to the run's timeline now, stamped with the run's state, after
// any events still waiting for the run's next save (so the timeline keeps its order), and
// without waiting: the write overlaps the call the event announces (the
// package sent), so it costs the hop no store round trip of its own. The returned function
// waits for the write; call it before the run's next write, which keeps the timeline in
// order.
func (s *Server) eventAsync(ctx context.Context, job *handoffv1.Job, ev *handoffv1.JobEvent) (wait func()) {
	s.stamp(job, ev)
	runID := job.GetRunId()
	evs := append(s.takePending(runID), ev)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Off the hop's path: on bbolt the write may wait a moment for the receiver's first
		// write (the runner's Admit, when they share the store) and share its fsync.
		s.appendEvents(store.Linger(ctx, asyncEventLinger), runID, evs)
	}()
	return func() { <-done }
}

// later stamps an event like event, but writes it with the run's next save (save, finish),
// in the same store write as the state it led to, or drops it when the step fails before
// that save (dropUnsaved): a hop's outcome is then one write instead of one per event, and a
// crash cannot keep the events without the state or the state without the events. The
// package sent to an agent, which a watcher should see before the slow call, goes through
// announce instead.
func (s *Server) later(job *handoffv1.Job, ev *handoffv1.JobEvent) {
	s.stamp(job, ev)
	s.mu.Lock()
	s.pending[job.GetRunId()] = append(s.pending[job.GetRunId()], ev)
	s.mu.Unlock()
}

// takePending removes and returns the run's waiting events. A carried move goes with them:
// they are saved together or dropped together.
func (s *Server) takePending(runID string) []*handoffv1.JobEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs := s.pending[runID]
	delete(s.pending, runID)
	delete(s.carried, runID)
	return evs
}

// carry leaves the move an agent hop just applied to the run unsaved, its events waiting
// in pending: the next package sent is recorded in the same store write as the move that
// chose it (announce), one write per hop instead of two. Whatever the driver does next
// writes the run first: announce, a save of another step, or flush.
func (s *Server) carry(runID string) {
	s.mu.Lock()
	s.carried[runID] = true
	s.mu.Unlock()
}

// carrying reports whether the run has a carried move not yet saved.
func (s *Server) carrying(runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.carried[runID]
}

// flush saves the run when its last move was carried: before a step that does not start
// with a package of its own (a fan-out, a sub-job), before a call that may wait, and when
// the driver stops (keepCarried).
func (s *Server) flush(ctx context.Context, job *handoffv1.Job) error {
	if !s.carrying(job.GetRunId()) {
		return nil
	}
	return s.save(ctx, job)
}

// announce records the package-sent event ev before its call: with the carried move that
// chose the stage, in one save before the package leaves (an error means nothing was sent);
// otherwise on its own, overlapping the call (eventAsync). Call wait before the run's next
// write.
func (s *Server) announce(ctx context.Context, job *handoffv1.Job, ev *handoffv1.JobEvent) (wait func(), err error) {
	if !s.carrying(job.GetRunId()) {
		return s.eventAsync(ctx, job, ev), nil
	}
	s.later(job, ev)
	if err := s.save(ctx, job); err != nil {
		return nil, err
	}
	return func() {}, nil
}

// dropUnsaved drops the run's waiting events after a step that did not save: the step is
// repeated from the run's last saved state, and records its events again then.
func (s *Server) dropUnsaved(runID string, why string) {
	s.logDropped(runID, s.takePending(runID), why)
}

// logDropped says that evs, the events of a step whose state was not saved, are dropped.
func (s *Server) logDropped(runID string, evs []*handoffv1.JobEvent, why string) {
	if len(evs) > 0 {
		s.log.Warn("events of a step that was not saved are dropped; the step is repeated from the saved run",
			"run_id", runID, "events", len(evs), "why", why)
	}
}

// stamp fills what every event of the run carries.
func (s *Server) stamp(job *handoffv1.Job, ev *handoffv1.JobEvent) {
	ev.RunId = job.GetRunId()
	ev.JobId = job.GetJobId()
	ev.At = timestamppb.New(s.opts.Now())
	if ev.Traceparent == "" {
		ev.Traceparent = job.GetTraceparent()
	}
	if ev.Wallet == nil {
		// The run's wallet as it stands, shared: the driver replaces job.Wallet whenever
		// the wallet changes (setWallet), never changes it in place.
		ev.Wallet = job.GetWallet()
	}
	if ev.Hop == 0 {
		ev.Hop = job.GetHops()
	}
}
