package bench

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Store kinds of a rig.
const (
	StoreRedis = "redis"
	StoreBolt  = "bolt"
)

// benchStage is the stage (and Noop agent name) of the hop figures.
const benchStage = "bench"

// quietLogger is the logging of `handoff up` without -v (JSON, warnings and up) written
// to io.Discard: the handler's level check and formatting of warnings are paid, the
// terminal is not.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// hopConfig configures a platform-hop rig (figures B, C and R).
type hopConfig struct {
	Store     string // StoreRedis or StoreBolt
	RedisAddr string
	// BaseDir is where the rig's folder (bbolt file, artifacts) is made; "" = os.TempDir().
	BaseDir string
	// Workers is how many calls may be in flight (each has its own wallet and run).
	Workers   int
	Validator *contract.Validator
	Logger    *slog.Logger
}

// hopRig is one agent runner served exactly as the platform serves it
// (internal/server: the runner's chain with metrics, identity, tracing, health), a Noop
// agent behind a counting wrapper, a store, and a client that calls with the coordinator's
// service token.
type hopRig struct {
	st        store.Store
	dir       string
	redisAddr string
	prefix    string
	agent     *CountingAgent
	g         *server.Server
	cc        *grpc.ClientConn
	client    handoffv1.AgentRunnerServiceClient
	tp        *sdktrace.TracerProvider
	tmpl      *template
	jobPrefix string
	seq       atomic.Uint64
	workers   []*hopWorker
}

// hopWorker is what one in-flight slot owns: the wallet its hops are debited from and the
// run it records them in (as the coordinator keeps one run per job).
type hopWorker struct {
	walletID string
	run      *handoffv1.Job
}

func newHopRig(ctx context.Context, cfg hopConfig) (_ *hopRig, err error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	r := &hopRig{tmpl: newTemplate(benchStage), jobPrefix: "bench-" + randomHex(4)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.dir, err = os.MkdirTemp(cfg.BaseDir, "handoff-bench-"); err != nil {
		return nil, err
	}
	switch cfg.Store {
	case StoreRedis:
		prefix := newPrefix("hop")
		st, err := store.OpenRedis(ctx, store.RedisOptions{Addr: cfg.RedisAddr, Prefix: prefix})
		if err != nil {
			return nil, err
		}
		r.st, r.redisAddr, r.prefix = st, cfg.RedisAddr, prefix
	case StoreBolt:
		st, err := store.Open(filepath.Join(r.dir, "handoff.db"))
		if err != nil {
			return nil, err
		}
		r.st = st
	default:
		return nil, fmt.Errorf("bench: unknown store %q", cfg.Store)
	}
	arts, err := artifact.NewFiles(filepath.Join(r.dir, "artifacts"))
	if err != nil {
		return nil, err
	}
	v := cfg.Validator
	if v == nil {
		if v, err = contract.NewValidator(); err != nil {
			return nil, err
		}
	}
	r.agent = NewCountingAgent(agentrunner.NewNoop(benchStage))
	srv, err := agentrunner.New(agentrunner.Options{Validator: v, Store: r.st, Artifacts: arts, Agents: []agentrunner.Agent{r.agent}, Logger: cfg.Logger.With("service", "agentrunner")})
	if err != nil {
		return nil, err
	}
	// What stack.Start does for each service: the coordinator's own token key, a verifier
	// holding its public key, the default identity policy, an SDK tracer provider, the
	// service's metrics.
	signer, err := identity.GenerateSigner("coordinator")
	if err != nil {
		return nil, err
	}
	verifier, err := identity.NewVerifier("agentrunner", map[string]ed25519.PublicKey{"coordinator": signer.PublicKey()})
	if err != nil {
		return nil, err
	}
	if r.tp, err = telemetry.NewTracerProvider(ctx, "handoff-bench"); err != nil {
		return nil, err
	}
	authz := identity.NewAuthorizer(identity.WithVerifier(verifier), identity.WithPolicy(identity.DefaultPolicy()), identity.WithLogger(cfg.Logger))
	if r.g, err = server.New(srv.Service(), server.WithSecurity(nil, authz), server.WithLogger(cfg.Logger),
		server.WithTracerProvider(r.tp), server.WithMetrics(telemetry.NewRegistry()), server.WithHealthFrom(r.st, 0)); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go r.g.Serve(lis)
	if r.cc, err = rpc.Dial(lis.Addr().String(), rpc.DialConfig{TracerProvider: r.tp, PerRPC: signer.PerRPCCredentials()}); err != nil {
		return nil, err
	}
	r.client = handoffv1.NewAgentRunnerServiceClient(r.cc)

	if r.workers, err = newHopWorkers(ctx, r.st, r.tmpl, r.jobPrefix, cfg.Workers); err != nil {
		return nil, err
	}
	return r, nil
}

// newHopWorkers makes one wallet and one run per in-flight slot, before any hop is timed.
// They are all runs of job jobPrefix: a wallet pays only for its own job's packages.
func newHopWorkers(ctx context.Context, st store.Store, tmpl *template, jobPrefix string, n int) ([]*hopWorker, error) {
	now := timestamppb.Now()
	var out []*hopWorker
	for i := range n {
		w := &hopWorker{walletID: fmt.Sprintf("%s-w%02d", jobPrefix, i)}
		if _, err := st.OpenWallet(ctx, w.walletID, jobPrefix, &handoffv1.Budget{UsdRemainingMicros: math.MaxInt64 / 2, HopsRemaining: math.MaxUint32}); err != nil {
			return nil, err
		}
		w.run = newBenchRun(tmpl, w.walletID, jobPrefix, now)
		if _, _, err := st.CreateRun(ctx, w.run); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

func (r *hopRig) nextJob() string { return fmt.Sprintf("%s-%d", r.jobPrefix, r.seq.Add(1)) }

// nextStage is a stage of job jobPrefix no hop ran yet ("bench-<n>", served by the bench
// agent), so each hop is a new stage completion paid from its worker's wallet, as the
// hops of one job are.
func (r *hopRig) nextStage() string { return fmt.Sprintf("%s-%d", benchStage, r.seq.Add(1)) }

// hop is figures B and C: one valid package delivered (Ack ACCEPTED, then the StageResult
// COMPLETED, both on the package's trace), then the run saved with one PutRun.
func (r *hopRig) hop(ctx context.Context, worker int) error {
	w := r.workers[worker%len(r.workers)]
	tp := newTraceparent(nil)
	p := r.tmpl.make(r.jobPrefix, tp, w.walletID)
	p.Stage = r.nextStage()
	ack, res, err := rpc.Deliver(onTrace(ctx, tp), r.client, &handoffv1.DeliverRequest{Package: p, Agent: benchStage})
	if err != nil {
		return err
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		return fmt.Errorf("hop %s: ack %s, result %s (%v)", p.GetJobId(), ack.GetStatus(), res.GetStatus(), ack.GetReasons())
	}
	if ack.GetTraceparent() != tp || res.GetTraceparent() != tp {
		return fmt.Errorf("hop %s: trace break: sent %s, ack %s, result %s", p.GetJobId(), tp, ack.GetTraceparent(), res.GetTraceparent())
	}
	return saveHop(ctx, r.st, w.run, p, ack, res)
}

// newBenchRun is the run one in-flight slot records its hops in (one run per job, as the
// coordinator keeps).
func newBenchRun(t *template, runID, job string, now *timestamppb.Timestamp) *handoffv1.Job {
	return &handoffv1.Job{
		RunId: runID, JobId: job, Pipeline: "bench", State: handoffv1.JobState_JOB_STATE_RUNNING,
		Goal: t.goal, Constraints: t.constraints, Artifacts: t.artifacts, ToolsTried: t.toolsTried,
		MemoryRefs: t.memoryRefs, Stage: benchStage, CreatedAt: now, UpdatedAt: now,
		Wallet: &handoffv1.Budget{UsdRemainingMicros: 1_196_500, RevisionsRemaining: 2, HopsRemaining: 10, WalletId: runID},
	}
}

// saveHop records a hop the way the coordinator does after a result: it mirrors the
// wallet the runner debited into the run and saves the run with the hop's ACK and
// STAGE_RESULT events, in one write.
func saveHop(ctx context.Context, st store.Store, run *handoffv1.Job, p *handoffv1.HandoffPackage, ack *handoffv1.Ack, res *handoffv1.StageResult) error {
	run.Hops++
	if aw := ack.GetWallet(); aw != nil {
		run.Wallet = aw
	}
	run.NextHint = res.GetNextHint()
	run.UpdatedAt = timestamppb.Now()
	tp := p.GetTrace().GetTraceparent()
	return st.PutRun(ctx, run,
		&handoffv1.JobEvent{RunId: run.GetRunId(), JobId: p.GetJobId(), Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: benchStage, Ack: ack, Traceparent: tp, At: run.UpdatedAt, Hop: run.GetHops()},
		&handoffv1.JobEvent{RunId: run.GetRunId(), JobId: p.GetJobId(), Kind: handoffv1.EventKind_EVENT_KIND_STAGE_RESULT, Stage: benchStage, Result: res, Traceparent: tp, At: run.UpdatedAt, Hop: run.GetHops()})
}

// onTrace is ctx on the trace of traceparent tp, as the coordinator sends a hop from its
// span on the package's trace: the call's metadata then carries the package's trace, and
// the runner's trace interceptor has no mismatch to warn about (a client on a trace of its
// own would make every hop write that warning).
func onTrace(ctx context.Context, tp string) context.Context {
	pctx, _ := hoptrace.Parse(ctx, tp, "")
	return pctx
}

// rejected is figure R: a package without a goal; the Ack must be REJECTED_SCHEMA.
func (r *hopRig) rejected(ctx context.Context, _ int) error {
	tp := newTraceparent(nil)
	p := r.tmpl.make(r.nextJob(), tp, "")
	p.Goal = ""
	ack, _, err := rpc.Deliver(onTrace(ctx, tp), r.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil {
		return err
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || ack.GetTraceparent() != tp {
		return fmt.Errorf("rejected %s: ack %s on %s, want REJECTED_SCHEMA on %s", p.GetJobId(), ack.GetStatus(), ack.GetTraceparent(), tp)
	}
	return nil
}

// boltWriter is figure W_bolt: one bbolt write transaction (an idempotency Claim of a fresh
// key), the unit every bbolt-backed store write costs.
type boltWriter struct {
	st  *store.Bolt
	dir string
	seq atomic.Uint64
}

func newBoltWriter(baseDir string) (*boltWriter, error) {
	dir, err := os.MkdirTemp(baseDir, "handoff-bench-w-")
	if err != nil {
		return nil, err
	}
	st, err := store.Open(filepath.Join(dir, "handoff.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &boltWriter{st: st, dir: dir}, nil
}

func (w *boltWriter) write(ctx context.Context, _ int) error {
	state, _, _, err := w.st.Claim(ctx, fmt.Sprintf("w-%d", w.seq.Add(1)), claimTTL)
	if err == nil && state != store.Claimed {
		err = fmt.Errorf("claim of a fresh key: %s", state)
	}
	return err
}

func (w *boltWriter) close() {
	w.st.Close()
	os.RemoveAll(w.dir)
}

func (r *hopRig) close() {
	if r.cc != nil {
		r.cc.Close()
	}
	if r.g != nil {
		r.g.Stop()
	}
	if r.st != nil {
		r.st.Close()
	}
	if r.tp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.tp.Shutdown(ctx)
		cancel()
	}
	if r.prefix != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		deletePrefix(ctx, r.redisAddr, r.prefix)
		cancel()
	}
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
}
