package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/internal/testkit"
)

const (
	writeMethod   = handoffv1.WritebackService_Write_FullMethodName
	deliverMethod = handoffv1.AgentRunnerService_Deliver_FullMethodName
	checkMethod   = handoffv1.AgentRunnerService_Check_FullMethodName
)

var quiet = slog.New(slog.DiscardHandler)

// ---- stores ----

// openBolt is the real embedded store on a fresh file.
func openBolt(t testing.TB) *store.Bolt {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// openRedis is the Redis store every Redis test here uses: storetest.OpenRedis (its own key
// prefix, deleted afterwards; fails under CI without a server, skipped elsewhere).
var openRedis = storetest.OpenRedis

// faultStore wraps a real store, counts calls and fails the ones it is told to.
type faultStore struct {
	store.Idempotency
	claimErr, completeErr, releaseErr error

	claims, completes, releases atomic.Int32
}

func (f *faultStore) Claim(ctx context.Context, key string, ttl time.Duration) (store.ClaimState, []byte, string, error) {
	f.claims.Add(1)
	if f.claimErr != nil {
		return 0, nil, "", f.claimErr
	}
	return f.Idempotency.Claim(ctx, key, ttl)
}

func (f *faultStore) Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error {
	f.completes.Add(1)
	if f.completeErr != nil {
		return f.completeErr
	}
	return f.Idempotency.Complete(ctx, key, owner, value, ttl)
}

func (f *faultStore) Release(ctx context.Context, key, owner string) error {
	f.releases.Add(1)
	if f.releaseErr != nil {
		return f.releaseErr
	}
	return f.Idempotency.Release(ctx, key, owner)
}

// lookup reads key's record state (0: none).
func lookup(t testing.TB, st store.Idempotency, key string) (store.ClaimState, []byte) {
	t.Helper()
	state, value, err := st.Lookup(context.Background(), key)
	if err != nil {
		t.Fatalf("Lookup(%s): %v", key, err)
	}
	return state, value
}

// waitDone waits until key holds a result and returns it.
func waitDone(t testing.TB, st store.Idempotency, key string) []byte {
	t.Helper()
	var value []byte
	testkit.Eventually(t, 10*time.Second, "key "+key+" to complete", func() bool {
		var state store.ClaimState
		state, value = lookup(t, st, key)
		return state == store.Done
	})
	return value
}

// ---- requests and keys ----

// pkg is a valid package of jobID for stage that the judge passed, with one artifact.
func pkg(jobID, stage string) *handoffv1.HandoffPackage {
	return testkit.Package(testkit.OfJob(jobID), testkit.AtStage(stage), testkit.Passed(), func(p *handoffv1.HandoffPackage) {
		p.Artifacts = []*handoffv1.Artifact{{Type: "summary_md", SchemaVersion: "summary_md.v1", Uri: "file:///a/summary.md"}}
	})
}

func writeReq(jobID string) *handoffv1.WriteRequest {
	p := pkg(jobID, "writeback")
	return &handoffv1.WriteRequest{Package: p, Artifact: p.GetArtifacts()[0], Target: "ledger"}
}

// writeKey is the writeback's key: job_id:stage:artifact_type.
func writeKey(m proto.Message) (string, error) {
	r := m.(*handoffv1.WriteRequest)
	p := r.GetPackage()
	if p.GetJobId() == "" || p.GetStage() == "" || r.GetArtifact().GetType() == "" {
		return "", errors.New("job_id, stage and artifact.type are required")
	}
	return p.GetJobId() + ":" + p.GetStage() + ":" + r.GetArtifact().GetType(), nil
}

func markDuplicate(m proto.Message) { m.(*handoffv1.WriteResponse).Duplicate = true }

// writeOpts are the interceptor options the writeback would use.
func writeOpts(extra ...idempotency.Option) []idempotency.Option {
	return append([]idempotency.Option{
		idempotency.WithKey(writeMethod, func() proto.Message { return &handoffv1.WriteResponse{} }, writeKey),
		idempotency.WithReplay(writeMethod, markDuplicate),
		idempotency.WithLogger(quiet),
	}, extra...)
}

func deliverReq(jobID string) *handoffv1.DeliverRequest {
	return &handoffv1.DeliverRequest{Package: pkg(jobID, "draft")}
}

// deliverKey is the runner's completion key: stage:<job_id>:<stage>:<round>.
func deliverKey(m proto.Message) (string, error) {
	p := m.(*handoffv1.DeliverRequest).GetPackage()
	if p.GetJobId() == "" || p.GetStage() == "" {
		return "", errors.New("package.job_id and package.stage are required")
	}
	return fmt.Sprintf("stage:%s:%s:%d", p.GetJobId(), p.GetStage(), p.GetEvaluator().GetRounds()), nil
}

// deliverReplay answers a re-delivery with a DUPLICATE ack carrying the stored PriorResult.
func deliverReplay(req proto.Message, stored []byte) (proto.Message, error) {
	prior := &handoffv1.PriorResult{}
	if err := proto.Unmarshal(stored, prior); err != nil {
		return nil, err
	}
	ack := contract.AckFor(req.(*handoffv1.DeliverRequest).GetPackage(), handoffv1.AckStatus_ACK_STATUS_DUPLICATE)
	ack.Prior = prior
	return &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}, nil
}

// deliverRecord settles the key on the StageResult: COMPLETED is stored as a PriorResult,
// FAILED releases. The ack settles nothing.
func deliverRecord(_ context.Context, _ proto.Message, sent proto.Message) ([]byte, bool, bool) {
	res := sent.(*handoffv1.DeliverResponse).GetResult()
	if res == nil {
		return nil, false, false
	}
	if res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		return nil, false, true
	}
	b, err := proto.Marshal(&handoffv1.PriorResult{
		Artifacts: res.GetArtifacts(), Evaluator: res.GetEvaluator(), NextHint: res.GetNextHint(),
		CompletedAt: timestamppb.Now(),
	})
	if err != nil {
		return nil, false, true
	}
	return b, true, false
}

func deliverOpts(extra ...idempotency.StreamOption) []idempotency.StreamOption {
	return append([]idempotency.StreamOption{
		idempotency.WithStreamKey(deliverMethod, func() proto.Message { return &handoffv1.DeliverRequest{} }, deliverKey),
		idempotency.WithStreamReplay(deliverMethod, deliverReplay),
		idempotency.WithStreamRecord(deliverMethod, deliverRecord),
		idempotency.WithLogger(quiet),
	}, extra...)
}

// ---- status helpers ----

func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func wantCode(t testing.TB, err error, code codes.Code, msgPart string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error = %v; want code %s", err, code)
	}
	if msgPart != "" && !strings.Contains(status.Convert(err).Message(), msgPart) {
		t.Fatalf("error message %q; want it to contain %q", status.Convert(err).Message(), msgPart)
	}
}

// ---- servers ----

// serve assembles a server as a service's is (internal/server), with the interceptors
// under test as its enforcement, and returns a client connection to it.
func serve(t testing.TB, register func(*grpc.Server), unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) *grpc.ClientConn {
	t.Helper()
	srv, err := server.New(server.Service{Name: "idempotency-test", Register: register, Unary: unary, Stream: stream},
		server.WithoutIdentity(), server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return testkit.Serve(t, srv)
}

// retrying calls fn until it answers other than Aborted, sleeping the RetryInfo delay
// between attempts. It returns the answer and how many Aborted answers came first.
func retrying[T any](ctx context.Context, fn func() (T, error)) (T, int, error) {
	aborts := 0
	for {
		out, err := fn()
		if status.Code(err) != codes.Aborted {
			return out, aborts, err
		}
		d, ok := retryDelay(err)
		if !ok {
			return out, aborts, fmt.Errorf("aborted without RetryInfo: %w", err)
		}
		aborts++
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return out, aborts, ctx.Err()
		}
	}
}

// ---- fake WritebackService ----

// sink is the external system: an append-only list of writes, deliberately not idempotent.
type sink struct {
	mu     sync.Mutex
	writes []string
}

func (s *sink) write(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, key)
	return fmt.Sprintf("ext-%03d", len(s.writes))
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.writes)
}

type fakeWriteback struct {
	handoffv1.UnimplementedWritebackServiceServer
	sink  sink
	calls atomic.Int32
	// delay is how long a write takes; failFirst calls fail (Unavailable) before writing.
	delay     time.Duration
	failFirst atomic.Int32
	// started receives once per call when set; the call then waits for proceed.
	started chan struct{}
	proceed chan struct{}
	// selfStore, when set, is where the handler stores its response itself (Claim.Stored),
	// as a target in the idempotency store would with its write; claims gets each Claim.
	selfStore store.Idempotency
	claims    chan *idempotency.Claim
}

func (f *fakeWriteback) Write(ctx context.Context, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	f.calls.Add(1)
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.proceed != nil {
		select {
		case <-f.proceed:
		case <-ctx.Done(): // a handler that honours cancellation: only detaching lets it write
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.failFirst.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "target ledger: connection refused")
	}
	key, _ := writeKey(req)
	id := f.sink.write(key)
	resp := &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{
		IdempotencyKey: key, Target: req.GetTarget(), ExternalId: id,
		WrittenAt: timestamppb.Now(), JobId: req.GetPackage().GetJobId(),
		Traceparent: req.GetPackage().GetTrace().GetTraceparent(),
	}}
	if f.claims != nil {
		c, _ := idempotency.ClaimFrom(ctx)
		f.claims <- c
	}
	if f.selfStore != nil {
		c, ok := idempotency.ClaimFrom(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no claim in the handler's context")
		}
		data, err := proto.Marshal(resp)
		if err != nil {
			return nil, err
		}
		if err := f.selfStore.Complete(ctx, c.Key, c.Owner, data, c.ResultTTL); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		c.Stored()
	}
	return resp, nil
}

func writebackClient(t testing.TB, st store.Idempotency, f *fakeWriteback, opts ...idempotency.Option) handoffv1.WritebackServiceClient {
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterWritebackServiceServer(s, f) },
		[]grpc.UnaryServerInterceptor{idempotency.UnaryServerInterceptor(st, writeOpts(opts...)...)}, nil)
	return handoffv1.NewWritebackServiceClient(conn)
}

// ---- fake AgentRunnerService ----

type fakeRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	calls atomic.Int32
	// delay is how long a stage runs; failFirst runs report STAGE_STATUS_FAILED;
	// errFirst runs return an error after the ack, without a result.
	delay     time.Duration
	failFirst atomic.Int32
	errFirst  atomic.Int32
	// started receives once per run after the ack when set; the run then waits for proceed.
	started chan struct{}
	proceed chan struct{}
	lastJob atomic.Value // job id of the last request the handler read
}

func (f *fakeRunner) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	n := f.calls.Add(1)
	p := req.GetPackage()
	f.lastJob.Store(p.GetJobId())
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}); err != nil {
		return err
	}
	ctx := stream.Context()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.proceed != nil {
		select {
		case <-f.proceed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.errFirst.Add(-1) >= 0 {
		return status.Error(codes.Internal, "agent lost")
	}
	res := &handoffv1.StageResult{
		JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
		Artifacts: []*handoffv1.Artifact{{Type: "draft_md", SchemaVersion: "draft_md.v1", Uri: fmt.Sprintf("file:///a/draft-%d.md", n), ProducedBy: "draft"}},
		NextHint:  fmt.Sprintf("run %d", n),
	}
	if f.failFirst.Add(-1) >= 0 {
		res = &handoffv1.StageResult{JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_FAILED, Error: "agent crashed"}
	}
	return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}})
}

func runnerClient(t testing.TB, st store.Idempotency, f *fakeRunner, opts ...idempotency.StreamOption) handoffv1.AgentRunnerServiceClient {
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(s, f) },
		nil, []grpc.StreamServerInterceptor{idempotency.StreamServerInterceptor(st, deliverOpts(opts...)...)})
	return handoffv1.NewAgentRunnerServiceClient(conn)
}

// deliver makes one Deliver call and reads its stream to the end.
func deliver(ctx context.Context, c handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) ([]*handoffv1.DeliverResponse, error) {
	stream, err := c.Deliver(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*handoffv1.DeliverResponse
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

func ackStatus(msgs []*handoffv1.DeliverResponse) handoffv1.AckStatus {
	if len(msgs) == 0 {
		return handoffv1.AckStatus_ACK_STATUS_UNSPECIFIED
	}
	return msgs[0].GetAck().GetStatus()
}

// deliverEach delivers a package of each job at once, one call per job; wait waits for them
// all and returns each call's error and how long it took, by job.
func deliverEach(ctx context.Context, c handoffv1.AgentRunnerServiceClient, jobs []string) (wait func() ([]error, []time.Duration)) {
	errs := make([]error, len(jobs))
	took := make([]time.Duration, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = deliver(ctx, c, deliverReq(job))
			took[i] = time.Since(start)
		}()
	}
	return func() ([]error, []time.Duration) {
		wg.Wait()
		return errs, took
	}
}
