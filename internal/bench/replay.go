package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/bench/peer"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/writeback"
)

// Kind is what a replayed package was generated as.
type Kind string

// The kinds of package a replay generates. Every invalid kind has one expected Ack status.
const (
	KindValid              Kind = "valid"
	KindDuplicate          Kind = "duplicate"
	KindMissingJobID       Kind = "missing_job_id"
	KindMissingGoal        Kind = "missing_goal"
	KindMissingBudget      Kind = "missing_budget"
	KindMissingArtifactURI Kind = "missing_artifact_uri"
	KindWrongVersion       Kind = "wrong_version"
	KindBadTraceparent     Kind = "bad_traceparent"
	KindZeroTraceID        Kind = "zero_trace_id"
	KindEmptyMoney         Kind = "empty_wallet_money"
	KindEmptyHops          Kind = "empty_wallet_hops"
)

// InvalidKinds are the invalid kinds, in the order they are dealt out.
var InvalidKinds = []Kind{
	KindMissingJobID, KindMissingGoal, KindMissingBudget, KindMissingArtifactURI, KindWrongVersion,
	KindBadTraceparent, KindZeroTraceID, KindEmptyMoney, KindEmptyHops,
}

// Expected is the Ack status a package of kind k must get.
func Expected(k Kind) handoffv1.AckStatus {
	switch k {
	case KindValid:
		return handoffv1.AckStatus_ACK_STATUS_ACCEPTED
	case KindDuplicate:
		return handoffv1.AckStatus_ACK_STATUS_DUPLICATE
	case KindEmptyMoney, KindEmptyHops:
		return handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET
	}
	return handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA
}

func statusName(s handoffv1.AckStatus) string { return strings.TrimPrefix(s.String(), "ACK_STATUS_") }

// ReplayConfig configures Replay.
type ReplayConfig struct {
	// N packages are sent: Invalid and Duplicate are the fractions of invalid packages and
	// of re-deliveries of earlier valid ones; the rest are valid, each for its own job.
	N                  int
	Invalid, Duplicate float64
	// Seed makes the kinds, their order and the traces reproducible (job ids carry a
	// random run prefix, so a second replay against the same deployment is not a duplicate).
	Seed int64
	// Concurrency bounds the hops in flight (default 32).
	Concurrency int
	// Stage the packages are addressed to; the runner must serve it with an agent that
	// completes them (default "replay").
	Stage string
	// Runner receives the hops (Deliver), as the coordinator.
	Runner handoffv1.AgentRunnerServiceClient
	// Writeback, when set, receives a write for every valid package that completed (and a
	// repeat of it for every duplicate), as the coordinator, with a judge's PASS.
	Writeback handoffv1.WritebackServiceClient
	// Artifacts, when set, stores the artifact to write for a result that carries none.
	Artifacts artifact.Store
	// Agent, when set, is the counting wrapper of the agent serving Stage: agent calls for
	// rejected packages are then counted exactly.
	Agent *CountingAgent
	// AcceptedCounter, when set (and Agent is not), reads the runner's count of ACCEPTED
	// Deliver acks (from /metrics) before and after: an agent runs only after ACCEPTED.
	AcceptedCounter func(context.Context) (float64, error)
	// Ledger, when set, is read after the replay to count the writes offered per key.
	Ledger store.Ledger
	// Progress, when set, is called after each package with the number done.
	Progress func(done int)
}

// KindReport is what one kind got.
type KindReport struct {
	Kind     Kind           `json:"kind"`
	Expected string         `json:"expected"`
	Sent     int            `json:"sent"`
	Got      map[string]int `json:"got"`
	Wrong    int            `json:"wrong"`
}

// WriteReport counts the writes.
type WriteReport struct {
	// Sent writes (first writes plus repeats for duplicates); Skipped: no artifact to write.
	Sent              int `json:"sent"`
	Skipped           int `json:"skipped"`
	Receipts          int `json:"receipts"`
	DuplicateReceipts int `json:"duplicate_receipts"`
	Errors            int `json:"errors"`
	// LedgerEntries and LedgerKeys of this replay's jobs ("unknown" without a ledger).
	LedgerEntries any `json:"ledger_entries"`
	LedgerKeys    any `json:"ledger_keys"`
	// DoubleWrites is the number of writes the ledger was offered beyond the first per key
	// (it upserts, so it absorbed them: each is a write the platform let through twice)
	// plus any entries beyond the first per key; without a ledger, the repeats whose
	// receipt named another external write than the first.
	DoubleWrites   int    `json:"double_writes"`
	DoubleWritesBy string `json:"double_writes_by"`
}

// ReplayReport is the outcome of Replay.
type ReplayReport struct {
	Target   string         `json:"target"`
	Store    string         `json:"store,omitempty"`
	Seed     int64          `json:"seed"`
	Sent     int            `json:"sent"`
	Acks     map[string]int `json:"acks"`
	Kinds    []*KindReport  `json:"kinds"`
	Wrong    int            `json:"wrong_statuses"`
	Failed   int            `json:"stage_failed"`
	RPCError int            `json:"rpc_errors"`
	// AgentCalls is the total number of agent runs (or "unknown").
	AgentCalls any `json:"agent_calls"`
	// AgentCallsForRejected are runs for packages that were rejected or were duplicates
	// (must be 0), or "unknown".
	AgentCallsForRejected any         `json:"agent_calls_for_rejected"`
	AgentCallsBy          string      `json:"agent_calls_by"`
	Writes                WriteReport `json:"writes"`
	TraceBreaks           int         `json:"trace_breaks"`
	TraceBreakSamples     []string    `json:"trace_break_samples,omitempty"`
	WrongSamples          []string    `json:"wrong_samples,omitempty"`
	ElapsedMS             float64     `json:"elapsed_ms"`
	HopsPerSec            float64     `json:"hops_per_sec"`
	HopP50us              float64     `json:"hop_p50_us"`
	HopP99us              float64     `json:"hop_p99_us"`
	Failures              []string    `json:"failures"`
	OK                    bool        `json:"ok"`
}

type replayItem struct {
	kind   Kind
	pkg    *handoffv1.HandoffPackage
	orig   int // duplicate: index of the original
	done   chan struct{}
	ack    *handoffv1.Ack
	result *handoffv1.StageResult
	err    error
	lat    time.Duration
	// receipt of the first write (valid) or of the repeat (duplicate)
	receipt *handoffv1.Receipt
	dupRcpt bool
	written *handoffv1.Artifact // the artifact the write named
}

// generate deals out the kinds (shuffled by seed, every duplicate after at least one
// valid package) and builds the packages.
func generate(cfg ReplayConfig, runPrefix string) ([]*replayItem, error) {
	n := cfg.N
	nInv := int(math.Round(float64(n) * cfg.Invalid))
	nDup := int(math.Round(float64(n) * cfg.Duplicate))
	if cfg.Invalid < 0 || cfg.Duplicate < 0 || nInv+nDup >= n {
		return nil, fmt.Errorf("replay: --invalid %.2f and --duplicate %.2f of %d leave no valid package", cfg.Invalid, cfg.Duplicate, n)
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6861_6e64_6f66_66))
	kinds := make([]Kind, 0, n)
	for i := range nInv {
		kinds = append(kinds, InvalidKinds[i%len(InvalidKinds)])
	}
	for range nDup {
		kinds = append(kinds, KindDuplicate)
	}
	for len(kinds) < n {
		kinds = append(kinds, KindValid)
	}
	rng.Shuffle(n, func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	// A duplicate re-delivers an earlier valid package: move any that has none before it.
	first := -1
	for i, k := range kinds {
		if k == KindValid {
			first = i
			break
		}
	}
	for i := 0; i < first; i++ {
		if kinds[i] == KindDuplicate {
			kinds[i], kinds[first] = kinds[first], kinds[i]
			break // the valid one moved to i; everything after it has an earlier valid
		}
	}
	tmpl := newTemplate(cfg.Stage)
	items := make([]*replayItem, n)
	var valid []int
	for i, k := range kinds {
		it := &replayItem{kind: k, done: make(chan struct{}), orig: -1}
		items[i] = it
		if k == KindDuplicate {
			it.orig = valid[rng.IntN(len(valid))]
			it.pkg = proto.Clone(items[it.orig].pkg).(*handoffv1.HandoffPackage) // the same bytes again
			continue
		}
		p := proto.Clone(tmpl.make(fmt.Sprintf("%s-%05d", runPrefix, i), newTraceparent(rng), "")).(*handoffv1.HandoffPackage)
		switch k {
		case KindValid:
			valid = append(valid, i)
		case KindMissingJobID:
			p.JobId = ""
		case KindMissingGoal:
			p.Goal = ""
		case KindMissingBudget:
			p.Budget = nil
		case KindMissingArtifactURI:
			p.Artifacts[rng.IntN(len(p.Artifacts))].Uri = ""
		case KindWrongVersion:
			p.Schema = "handoff.v9"
		case KindBadTraceparent:
			p.Trace.Traceparent = "00-not-a-trace-" + fmt.Sprintf("%08x", rng.Uint32()) + "-01"
		case KindZeroTraceID:
			p.Trace.Traceparent = "00-00000000000000000000000000000000-" + fmt.Sprintf("%016x", rng.Uint64()|1) + "-01"
		case KindEmptyMoney:
			p.Budget.UsdRemainingMicros = 0
		case KindEmptyHops:
			p.Budget.HopsRemaining = 0
		}
		it.pkg = p
	}
	return items, nil
}

// Replay sends cfg.N generated packages to cfg.Runner with cfg.Concurrency in flight, makes
// the writes, and reports what every kind got against what it must get.
func Replay(ctx context.Context, cfg ReplayConfig) (*ReplayReport, error) {
	if cfg.Runner == nil {
		return nil, errors.New("replay: no runner")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Stage == "" {
		cfg.Stage = "replay"
	}
	runPrefix := "rp-" + randomHex(4)
	items, err := generate(cfg, runPrefix)
	if err != nil {
		return nil, err
	}
	var accBefore float64
	var accErr error
	if cfg.Agent == nil && cfg.AcceptedCounter != nil {
		accBefore, accErr = cfg.AcceptedCounter(ctx)
	}

	var done atomic.Int64
	var wg sync.WaitGroup
	queue := make(chan *replayItem)
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range queue {
				cfg.send(ctx, items, it)
				close(it.done)
				if cfg.Progress != nil {
					cfg.Progress(int(done.Add(1)))
				}
			}
		}()
	}
	for _, it := range items {
		select {
		case queue <- it:
		case <-ctx.Done():
		}
	}
	close(queue)
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return cfg.report(ctx, items, runPrefix, elapsed, accBefore, accErr), nil
}

// send delivers one package and makes its write. A duplicate waits for its original (and
// the original's write) first: a re-delivery arrives after the first delivery finished.
func (cfg *ReplayConfig) send(ctx context.Context, items []*replayItem, it *replayItem) {
	if it.kind == KindDuplicate {
		select {
		case <-items[it.orig].done:
		case <-ctx.Done():
			it.err = ctx.Err()
			return
		}
	}
	hctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t := time.Now()
	it.ack, it.result, it.err = rpc.Deliver(hctx, cfg.Runner, &handoffv1.DeliverRequest{Package: it.pkg})
	it.lat = time.Since(t)
	if it.err != nil || cfg.Writeback == nil {
		return
	}
	var art *handoffv1.Artifact
	switch {
	case it.kind == KindValid && it.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_ACCEPTED &&
		it.result.GetStatus() == handoffv1.StageStatus_STAGE_STATUS_COMPLETED:
		if as := it.result.GetArtifacts(); len(as) > 0 {
			art = as[0]
		} else if cfg.Artifacts != nil {
			a, err := cfg.Artifacts.Put(hctx, artifact.Ref{JobID: it.pkg.GetJobId(), Stage: it.pkg.GetStage(), Type: "replay", SchemaVersion: "replay.v1", MediaType: "text/plain"}, []byte("replayed\n"))
			if err != nil {
				it.err = fmt.Errorf("store the artifact to write: %w", err)
				return
			}
			art = a
		}
	case it.kind == KindDuplicate && it.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
		// As the coordinator does: the duplicate's work is the prior result's.
		if as := it.ack.GetPrior().GetArtifacts(); len(as) > 0 {
			art = as[0]
		} else {
			art = items[it.orig].written
		}
	default:
		return
	}
	if art == nil {
		return // nothing to write: counted as skipped
	}
	it.written = art
	wp := proto.Clone(it.pkg).(*handoffv1.HandoffPackage)
	wp.Stage = "writeback"
	wp.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1}
	wp.Artifacts = append(wp.Artifacts, art)
	req := &handoffv1.WriteRequest{Package: wp, Artifact: art, Target: writeback.LedgerName}
	for attempt := 0; ; attempt++ {
		resp, err := cfg.Writeback.Write(hctx, req)
		if status.Code(err) == codes.Aborted && attempt < 50 { // the first write is in flight
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			it.err = fmt.Errorf("write: %w", err)
			return
		}
		it.receipt, it.dupRcpt = resp.GetReceipt(), resp.GetDuplicate()
		return
	}
}

func (cfg *ReplayConfig) report(ctx context.Context, items []*replayItem, runPrefix string, elapsed time.Duration, accBefore float64, accErr error) *ReplayReport {
	rep := &ReplayReport{Seed: cfg.Seed, Sent: len(items), Acks: map[string]int{}}
	byKind := map[Kind]*KindReport{}
	var lat []time.Duration
	accepted := 0
	sample := func(list *[]string, format string, args ...any) {
		if len(*list) < 5 {
			*list = append(*list, fmt.Sprintf(format, args...))
		}
	}
	firstReceipt := map[string]*handoffv1.Receipt{}
	for i, it := range items {
		kr := byKind[it.kind]
		if kr == nil {
			kr = &KindReport{Kind: it.kind, Expected: statusName(Expected(it.kind)), Got: map[string]int{}}
			byKind[it.kind] = kr
		}
		kr.Sent++
		got := "RPC_ERROR"
		if it.ack != nil {
			got = statusName(it.ack.GetStatus())
			lat = append(lat, it.lat)
		} else if it.err != nil {
			got = "RPC_ERROR:" + status.Code(it.err).String()
		}
		if it.err != nil {
			rep.RPCError++
			if it.ack != nil {
				got += "+WRITE_ERROR"
			}
		}
		rep.Acks[got]++
		kr.Got[got]++
		if got != kr.Expected {
			kr.Wrong++
			rep.Wrong++
			sample(&rep.WrongSamples, "#%d %s job %q: got %s, want %s %v", i, it.kind, it.pkg.GetJobId(), got, kr.Expected, errOr(it.err, it.ack.GetReasons()))
		}
		if it.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
			accepted++
			if it.result.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
				rep.Failed++
			}
		}
		// One trace: the ack and the result carry the package's traceparent, the receipt its
		// trace id.
		want := it.pkg.GetTrace().GetTraceparent()
		if it.ack != nil && it.ack.GetTraceparent() != want {
			rep.TraceBreaks++
			sample(&rep.TraceBreakSamples, "#%d %s: ack traceparent %q, package %q", i, it.kind, it.ack.GetTraceparent(), want)
		}
		if it.result != nil && it.result.GetTraceparent() != want {
			rep.TraceBreaks++
			sample(&rep.TraceBreakSamples, "#%d %s: result traceparent %q, package %q", i, it.kind, it.result.GetTraceparent(), want)
		}
		if r := it.receipt; r != nil && traceparent.TraceID(r.GetTraceparent()) != traceparent.TraceID(want) {
			rep.TraceBreaks++
			sample(&rep.TraceBreakSamples, "#%d %s: receipt trace %q, package %q", i, it.kind, r.GetTraceparent(), want)
		}
		// Writes.
		w := &rep.Writes
		wants := (it.kind == KindValid && it.result.GetStatus() == handoffv1.StageStatus_STAGE_STATUS_COMPLETED) ||
			(it.kind == KindDuplicate && it.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_DUPLICATE)
		switch {
		case cfg.Writeback == nil || !wants:
		case it.receipt != nil:
			w.Sent++
			if it.dupRcpt {
				w.DuplicateReceipts++
			} else {
				w.Receipts++
			}
			key := it.receipt.GetIdempotencyKey()
			if first, ok := firstReceipt[key]; !ok {
				firstReceipt[key] = it.receipt
			} else if first.GetExternalId() != it.receipt.GetExternalId() && cfg.Ledger == nil {
				w.DoubleWrites++
			}
		case it.err != nil:
			w.Sent++
			w.Errors++
		default:
			w.Skipped++
		}
	}
	for _, k := range append([]Kind{KindValid, KindDuplicate}, InvalidKinds...) {
		if kr := byKind[k]; kr != nil {
			rep.Kinds = append(rep.Kinds, kr)
		}
	}
	p50, p99 := quantiles(lat)
	rep.HopP50us, rep.HopP99us = micros(p50), micros(p99)
	rep.ElapsedMS = math.Round(float64(elapsed)/float64(time.Microsecond)) / 1000
	rep.HopsPerSec = peer.Round2(float64(len(items)) / elapsed.Seconds())

	// Agent calls.
	switch {
	case cfg.Agent != nil:
		rep.AgentCallsBy = "counting wrapper around the in-process agent"
		extra := 0
		for _, it := range items {
			switch {
			case it.kind == KindValid:
				if c := cfg.Agent.CallsFor(it.pkg.GetJobId()); it.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
					extra += max(c-1, 0) // one run is the valid package's own; more came from its duplicates
				} else {
					extra += c
				}
			case it.kind != KindDuplicate:
				extra += cfg.Agent.CallsFor(it.pkg.GetJobId())
			}
		}
		rep.AgentCalls, rep.AgentCallsForRejected = cfg.Agent.Calls(), extra
	case cfg.AcceptedCounter != nil && accErr != nil:
		rep.AgentCalls, rep.AgentCallsForRejected, rep.AgentCallsBy = "unknown", "unknown", "metrics unreadable before the replay: "+accErr.Error()
	case cfg.AcceptedCounter != nil:
		after, err := cfg.AcceptedCounter(ctx)
		if err != nil {
			rep.AgentCalls, rep.AgentCallsForRejected, rep.AgentCallsBy = "unknown", "unknown", "metrics unreadable after the replay: "+err.Error()
			break
		}
		delta := int(math.Round(after - accBefore))
		rep.AgentCalls, rep.AgentCallsForRejected = delta, delta-accepted
		rep.AgentCallsBy = "runner /metrics: ACCEPTED Deliver acks (an agent runs only after one) minus those this replay received; other traffic on the runner inflates it"
	default:
		rep.AgentCalls, rep.AgentCallsForRejected, rep.AgentCallsBy = "unknown", "unknown", "remote runner without --metrics"
	}

	// Ledger.
	w := &rep.Writes
	w.LedgerEntries, w.LedgerKeys = "unknown", "unknown"
	w.DoubleWritesBy = "receipts: a repeat naming another external write than the first"
	if cfg.Writeback == nil {
		w.DoubleWritesBy = "no writes (no writeback)"
	} else if cfg.Ledger != nil {
		if entries, err := cfg.Ledger.LedgerEntries(ctx); err != nil {
			w.DoubleWritesBy = "ledger unreadable: " + err.Error()
		} else {
			perKey := map[string]int{} // offers
			total := 0
			for _, e := range entries {
				if strings.HasPrefix(e.Key, runPrefix+"-") {
					perKey[e.Key] += max(e.Offers, 1)
					total++
				}
			}
			w.DoubleWrites = 0
			for _, c := range perKey {
				w.DoubleWrites += c - 1
			}
			w.LedgerEntries, w.LedgerKeys = total, len(perKey)
			w.DoubleWritesBy = "ledger offers per key beyond the first (the ledger upserts by key and counts each offer)"
		}
	}

	// Verdict.
	if rep.Wrong > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d packages got another status than their kind must get", rep.Wrong))
	}
	if n, ok := rep.AgentCallsForRejected.(int); ok && n != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("agent calls for rejected or duplicate packages: %d (must be 0)", n))
	}
	if w.DoubleWrites != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("double writes: %d (must be 0)", w.DoubleWrites))
	}
	if w.Errors != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("writes failed: %d", w.Errors))
	}
	if rep.TraceBreaks != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("trace breaks: %d (must be 0)", rep.TraceBreaks))
	}
	if rep.Failed != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("accepted stages that did not complete: %d", rep.Failed))
	}
	sort.Strings(rep.Failures)
	rep.OK = len(rep.Failures) == 0
	return rep
}

func errOr(err error, reasons []*handoffv1.Reason) any {
	if err != nil {
		return err
	}
	return reasons
}

// ReplayStack is an in-process platform for Replay: stack.Start on the embedded store with
// one Noop agent (storing a tiny artifact, so there is something to write) behind a
// counting wrapper for the replay's stage, and connections to the runner and the writeback
// that carry the coordinator's identity.
type ReplayStack struct {
	Stack     *stack.Stack
	Agent     *CountingAgent
	Runner    handoffv1.AgentRunnerServiceClient
	Writeback handoffv1.WritebackServiceClient
	// StoreNote describes where the store is (and flags tmpfs, where fsync does nothing).
	StoreNote string
	dir       string
}

// StartReplayStack starts the platform with its data in dataDir ("" = a new temporary
// folder, removed by Close).
func StartReplayStack(ctx context.Context, dataDir, stage string, log *slog.Logger) (*ReplayStack, error) {
	if log == nil {
		log = quietLogger()
	}
	rs := &ReplayStack{}
	if dataDir == "" {
		d, err := os.MkdirTemp("", "handoff-replay-")
		if err != nil {
			return nil, err
		}
		dataDir, rs.dir = d, d
	}
	rs.Agent = NewCountingAgent(&agentrunner.Noop{Role: agentrunner.RoleCard{Name: stage}, WriteArtifact: true})
	st, err := stack.Start(ctx, stack.Config{
		DataDir: dataDir, CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Agents: []agentrunner.Agent{rs.Agent}, Logger: log,
	})
	if err != nil {
		rs.Close()
		return nil, err
	}
	rs.Stack = st
	rc, err := st.DialAs(st.RunnerAddr, "coordinator")
	if err != nil {
		rs.Close()
		return nil, err
	}
	wc, err := st.DialAs(st.WritebackAddr, "coordinator")
	if err != nil {
		rs.Close()
		return nil, err
	}
	rs.Runner, rs.Writeback = handoffv1.NewAgentRunnerServiceClient(rc), handoffv1.NewWritebackServiceClient(wc)
	rs.StoreNote = "bbolt " + dataDir + "/handoff.db (fsync per write transaction)"
	if onTmpfs(dataDir) {
		rs.StoreNote = "bbolt " + dataDir + "/handoff.db on tmpfs: fsync does nothing, NOT DURABLE"
	}
	return rs, nil
}

// Close stops the platform and removes a temporary data folder.
func (rs *ReplayStack) Close() {
	if rs.Stack != nil {
		rs.Stack.Close()
	}
	if rs.dir != "" {
		os.RemoveAll(rs.dir)
	}
}

func onTmpfs(dir string) bool {
	var fs syscall.Statfs_t
	return syscall.Statfs(dir, &fs) == nil && fs.Type == 0x01021994 // TMPFS_MAGIC
}
