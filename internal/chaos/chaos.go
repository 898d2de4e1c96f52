// Package chaos is a fault-injection harness for the platform as it is deployed: on Redis
// (Config.Store redis or redis-cluster) the three service binaries as separate processes on
// the shared store, two coordinator replicas; on bbolt `handoff up`, the three services in
// one process on one bbolt file (layout.go: one file has one process, so every kill there
// kills all three, and is named by where it was made). And the external systems the
// writeback writes to (Config.Target): its ledger target, the demo ledger in the services'
// store (the shared Redis, or the bbolt file), which upserts by key and stores each entry
// with its receipt in one transaction (on a cluster, two steps); and an HTTP sink behind its
// webhook target, which records every write it receives and honours Idempotency-Key as a
// real downstream does.
//
// While jobs of the shipped support-ticket pipeline run (and, on the ledger target, every
// fourth one of research-brief: a fan-out of two branches, a merge and a sub-job), the
// harness
//
//   - SIGKILLs the writeback right after the sink applied a write and before the sink
//     answered it (the write happened, its receipt is lost), and, writing to the ledger, at
//     its crash points between the claim of a key and the answer (a writeback built with
//     -tags crashpoints reports each to the harness's hook, see internal/crashpoint),
//   - SIGKILLs a coordinator replica mid-job (the other one takes its runs over when their
//     leases lapse; on bbolt the restarted process takes them back when it opens the file),
//   - SIGKILLs the agent runner mid-stage (after it answered ACCEPTED, before the stage
//     result reached the coordinator),
//   - SIGKILLs redis-server and starts it again on the same port and append-only file (on
//     a cluster: a master, whose replica is promoted; none on bbolt),
//   - delivers a share of hops twice (the hop proxy, proxy.go),
//
// restarting every killed process. The faults are spread over the run by a plan keyed on the
// number of hops made so far. At the end every job must have reached a terminal state
// (completed, escalated or failed) before the deadline, no job may have been written twice
// (under two keys, or without a key), a re-sent key must carry the body first applied, no
// ledger key may have been offered twice (on one Redis and on bbolt, where entry and receipt
// are one transaction), every completed job must have its write in its external system, a ledger job's receipt must name its entry, and no branch of a fan-out
// job may be delivered again after it completed. Run returns a Report whose Violations
// list each of those that failed; `handoff chaos` prints it.
package chaos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rediscluster"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/pipelines"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// ErrNoRedisServer is returned when no redis-server binary can be found.
var ErrNoRedisServer = errors.New("chaos: redis-server not found (install it: apt-get install redis-server, or give its path)")

// Config is a chaos run. Zero values take the defaults in brackets.
type Config struct {
	Jobs          int     // jobs submitted [500]
	Kills         int     // SIGKILLs of each service: writeback, coordinator, agent runner [10]; -1 for none
	RedisRestarts int     // redis-server restarts [1]; -1 for none
	Redeliver     float64 // share of hops delivered twice [0.05]; negative for none
	Concurrency   int     // jobs in flight at once [32]
	// Deadline bounds the run from the first submission: every job must be terminal by
	// then [15m].
	Deadline time.Duration
	// LeaseTTL is the coordinators' --lease-ttl [1.5s]: how soon a killed replica's runs are
	// taken over.
	LeaseTTL time.Duration
	// WorkDir holds binaries, logs, Redis's files, artifacts and the sink's record of every
	// delivery (sink.jsonl). Empty: a temporary folder, removed afterwards unless Keep is
	// set or the run found a violation.
	WorkDir string
	Keep    bool
	// BinDir holds prebuilt coordinator, agentrunner and writeback binaries. Empty: they are
	// built with one `go build`, which must run inside the handoff source tree.
	BinDir string
	// RedisServer is the redis-server binary [found on PATH].
	RedisServer string
	// Seed makes the choice of re-delivered hops repeatable [random].
	Seed uint64
	// Target is where the jobs' writeback stage writes: TargetLedger, TargetSink, or
	// TargetBoth (every other job to each) [both].
	Target string
	// Progress receives a line per phase and every 5 seconds of the run (nil: quiet).
	Progress io.Writer
	// Store is the shared store the services run on: StoreRedis, one redis-server whose
	// restarts are the Redis faults, or StoreCluster, a local Redis Cluster of 3 masters and
	// 3 replicas (internal/rediscluster) whose Redis faults SIGKILL a master, so its
	// replica is promoted, and start it again later [redis].
	Store string
	// Wait makes the services' cluster store WAIT for one replica's acknowledgement of each
	// claim, receipt and ledger write before going on (redis-cluster://...?wait=1), closing
	// the window in which an acknowledged write is lost with its master. Cluster only.
	Wait bool
}

// The stores a chaos run can use.
const (
	StoreRedis   = "redis"
	StoreCluster = "redis-cluster"
	// StoreBolt: the embedded store, one bbolt file that one process holds (an exclusive
	// flock), so the deployment is `handoff up`: the three services in one process, run
	// as one supervised subprocess; every kill SIGKILLs all three (layout.go).
	StoreBolt = "bbolt"
)

// Stores lists the Config.Store values.
var Stores = []string{StoreRedis, StoreCluster, StoreBolt}

func (c *Config) defaults() {
	if c.Store == "" {
		c.Store = StoreRedis
	}
	if c.Jobs <= 0 {
		c.Jobs = 500
	}
	if c.Kills == 0 {
		c.Kills = 10
	}
	c.Kills = max(c.Kills, 0)
	if c.RedisRestarts == 0 && c.Store != StoreBolt { // bbolt: no Redis to restart
		c.RedisRestarts = 1
	}
	c.RedisRestarts = max(c.RedisRestarts, 0)
	if c.Redeliver == 0 {
		c.Redeliver = 0.05
	}
	c.Redeliver = min(max(c.Redeliver, 0), 1)
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
	if c.Deadline <= 0 {
		c.Deadline = 15 * time.Minute
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 1500 * time.Millisecond
	}
	if c.Target == "" {
		c.Target = TargetBoth
	}
	if c.Seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		for _, x := range b {
			c.Seed = c.Seed<<8 | uint64(x)
		}
	}
}

// Service timings of a chaos run: short, so a fault costs seconds rather than minutes.
const (
	stageTimeout   = 2 * time.Second // runner: bounds an agent run (its claim, 3s, is renewed while it runs)
	pendingTTL     = 6 * time.Second // writeback: a crashed write's claim lapses after 6s
	webhookTimeout = 2 * time.Second // under pendingTTL/2, as the writeback requires
	hopRetryFor    = 90 * time.Second
	hopTimeout     = 20 * time.Second
	// clusterNodeTimeout is the cluster's cluster-node-timeout: a killed master's replica
	// is promoted a little after it.
	clusterNodeTimeout = time.Second
	redisDown          = 2 * time.Second // how long Redis stays down at a restart
)

// Report is the outcome of a chaos run.
type Report struct {
	Jobs JobsReport `json:"jobs"`
	// Kills by service (coordinator counts both replicas), and what was asked of each.
	Kills      map[string]int `json:"kills"`
	KillsAsked int            `json:"kills_asked_per_service"`
	// Crashes are exits the harness did not cause (a service that cannot reach Redis at
	// start exits and is restarted), by service.
	Crashes map[string]int `json:"crashes"`
	// RedisRestarts are the Redis faults made: restarts of the one redis-server, or on a
	// cluster SIGKILLs of a master (its replica promoted; FailoverMs is each kill to the
	// cluster whole again).
	RedisRestarts      int     `json:"redis_restarts"`
	RedisRestartsAsked int     `json:"redis_restarts_asked"`
	FailoverMs         []int64 `json:"failover_ms,omitempty"`
	// Store is Config.Store; Wait, Config.Wait (WAIT for a replica before going on).
	Store string `json:"store"`
	Wait  bool   `json:"wait_for_replica"`
	// Deployment says how the services ran on the store (layout.go); Notes what differs
	// from the Redis layout (on bbolt: one process, so what a kill kills, and what does
	// not apply).
	Deployment string   `json:"deployment"`
	Notes      []string `json:"notes,omitempty"`
	// TimeToResume is, per kind of kill (coordinator, agentrunner, writeback, redis-master,
	// redis-restart), the time from the kill until each job it stalled made progress again
	// (resume.go).
	TimeToResume map[string]ResumeStats `json:"time_to_resume"`
	// ReplicationProbe (cluster only) is the replication hole measured at each master kill
	// (probe.go): acknowledged writes to the victim, and how many the failover lost.
	ReplicationProbe *ProbeReport `json:"replication_probe,omitempty"`
	// Hops counts distinct hops (job, stage, judge round); Calls every call the proxy
	// forwarded, retries included (re-delivered copies are not counted).
	Hops       int64            `json:"hops"`
	Calls      int64            `json:"calls"`
	Redelivery RedeliveryReport `json:"redelivery"`
	// Target is Config.Target; Sink and Ledger are what each external system saw.
	Target string       `json:"target"`
	Sink   SinkReport   `json:"sink"`
	Ledger LedgerReport `json:"ledger"`
	// WritebackKillsAt counts the writeback's kills by where they happened: killAtSink
	// ("sink-applied") or a crash point of a ledger write.
	WritebackKillsAt map[string]int `json:"writeback_kills_at"`
	// CompletedWithoutWrite counts completed jobs whose write their external system never
	// applied. Must be 0: a completed job holds a receipt, which the writeback issues only
	// after the write.
	CompletedWithoutWrite int `json:"completed_without_write"`
	// WrittenNotCompleted counts escalated or failed jobs whose write was applied (the
	// write happened but its receipt never reached the run).
	WrittenNotCompleted int `json:"written_not_completed"`
	// OverchargedJobs counts ended jobs whose wallet lost more hops than the run made, and
	// ExtraHopDebits those hops: a stage answered DUPLICATE to a re-delivery or a takeover's
	// repeat is debited by the coordinator although its first delivery already paid.
	OverchargedJobs int `json:"overcharged_jobs"`
	// FanoutJobs ran research-brief: a fan-out of two branches, a merge and a sub-job.
	FanoutJobs int `json:"fanout_jobs"`
	// BranchesRerun counts branches delivered again after they had completed (must be 0).
	BranchesRerun  int `json:"branches_rerun"`
	ExtraHopDebits int `json:"extra_hop_debits"`
	// Escalations and Failures count the non-completed outcomes by cause.
	Escalations map[string]int `json:"escalations,omitempty"`
	Failures    map[string]int `json:"failures,omitempty"`
	// Stops says how each service answered the final SIGTERM.
	Stops      map[string]string `json:"stops"`
	Seed       uint64            `json:"seed"`
	Build      string            `json:"build_time"`
	Duration   string            `json:"duration"`
	WorkDir    string            `json:"work_dir"`
	Violations []string          `json:"violations"`
}

// JobsReport counts jobs by their end state.
type JobsReport struct {
	Asked     int `json:"asked"`
	Submitted int `json:"submitted"`
	Completed int `json:"completed"`
	Escalated int `json:"escalated"`
	Failed    int `json:"failed"`
	// Lost jobs were not terminal at the deadline, or could not be submitted. Must be 0.
	Lost     int      `json:"lost"`
	LostJobs []string `json:"lost_jobs,omitempty"`
}

// fault kinds, in the order of the plan's offsets.
const (
	faultRunner = iota
	faultCoordinator
	faultWriteback
	faultRedis
	numFaults
)

// planOffsets place each kind's faults within its share of the run, so kinds do not fire
// on the same hop.
var planOffsets = [numFaults]float64{0.2, 0.45, 0.7, 0.55}

type harness struct {
	cfg   Config
	lay   layout
	dir   string
	say   func(format string, args ...any)
	rngMu sync.Mutex
	rng   *mrand.Rand

	redis     *redisProc            // StoreRedis
	cluster   *rediscluster.Cluster // StoreCluster
	restarts  atomic.Int32          // Redis faults done: restarts, or master kills
	failovers []time.Duration       // master kill to a whole cluster again (under planMu)
	resumes   *resumes
	probe     ProbeReport // under planMu
	coords    []*proc
	runner    *proc
	writeback *proc
	procs     []*proc
	sink      *sink
	proxy     *proxy
	storeURL  string

	maxHops int // the pipeline's max_hops: each job's wallet starts with it
	// fanHops is research-brief's max_hops; fanJobs the jobs that run it (a fan-out and a
	// sub-job on the ledger target).
	fanHops int
	fanJobs map[string]bool

	jobTarget map[string]string // job id -> TargetLedger or TargetSink (read-only in the run)
	killsAt   map[string]int    // writeback kills by where (under planMu)

	hops atomic.Int64 // distinct hops seen: the fault plan's clock
	// writes counts write attempts the writeback made (sink deliveries applied, ledger
	// writes claimed): the clock of its kills, which can only happen during a write. A
	// clock of hops could run out of writes (they come at each job's end, often in a burst
	// after a stall) before the planned kills came due.
	writes atomic.Int64
	calls  atomic.Int64 // calls forwarded, retries included
	seen   sync.Map     // hop keys already counted

	planMu    sync.Mutex
	killCount map[string]int // kills by kind (kindCoordinator, kindRunner, kindWriteback)
	at        [numFaults][]int64
	next      [numFaults]int
	busy      [numFaults]bool
}

// Run runs a chaos scenario and reports it. The error is for a harness that could not run
// (no redis-server, a build failure, a service that never came up); a run that found
// violations returns a Report listing them and no error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	if !slices.Contains(Targets, cfg.Target) {
		return nil, fmt.Errorf("chaos: target %q: want one of %s", cfg.Target, strings.Join(Targets, ", "))
	}
	if !slices.Contains(Stores, cfg.Store) {
		return nil, fmt.Errorf("chaos: store %q: want one of %s", cfg.Store, strings.Join(Stores, ", "))
	}
	if cfg.Wait && cfg.Store != StoreCluster {
		return nil, fmt.Errorf("chaos: wait is for the %s store only (one Redis has no replica to wait for)", StoreCluster)
	}
	if cfg.Store == StoreBolt && cfg.RedisRestarts > 0 {
		return nil, fmt.Errorf("chaos: redis restarts (%d) need a Redis; the %s store has none", cfg.RedisRestarts, StoreBolt)
	}
	lay := layoutOf(cfg.Store)
	h := &harness{cfg: cfg, lay: lay, killCount: map[string]int{}, rng: mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		jobTarget: map[string]string{}, killsAt: map[string]int{}, resumes: newResumes(), fanJobs: map[string]bool{}}
	var sayMu sync.Mutex // lines come from the proxy, the sink and the supervisors at once
	h.say = func(format string, args ...any) {
		if cfg.Progress != nil {
			sayMu.Lock()
			fmt.Fprintf(cfg.Progress, "chaos: "+format+"\n", args...)
			sayMu.Unlock()
		}
	}
	var redisPath string
	var err error
	if !lay.oneProcess { // bbolt runs without Redis
		redisBin := cfg.RedisServer
		if redisBin == "" {
			redisBin = "redis-server"
		}
		if redisPath, err = exec.LookPath(redisBin); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoRedisServer, err)
		}
	}

	ownDir := cfg.WorkDir == ""
	if ownDir {
		if h.dir, err = os.MkdirTemp("", "handoff-chaos-"); err != nil {
			return nil, err
		}
	} else {
		h.dir = cfg.WorkDir
	}
	rep := &Report{WorkDir: h.dir, Seed: cfg.Seed, KillsAsked: cfg.Kills, RedisRestartsAsked: cfg.RedisRestarts, Jobs: JobsReport{Asked: cfg.Jobs}, Target: cfg.Target,
		Store: cfg.Store, Wait: cfg.Wait, Deployment: lay.name}
	if lay.oneProcess {
		rep.Notes = []string{
			"one process: every kill SIGKILLs handoff up (coordinator, agent runner and writeback together) and starts it again on the same bbolt file; the kind of a kill says where it was made (coordinator mid-job, agentrunner mid-stage after ACCEPTED, writeback at a crash point or after the sink applied)",
			"redis_restarts: not applicable (no Redis on bbolt)",
			"targets: the ledger is the one in the bbolt file (entry and receipt in one transaction), read after the final stop; the sink honours Idempotency-Key",
			"timings are handoff up's own (coordinator lease 1.5s, runner stage claim 3s, writeback pending claim 2 min); --lease-ttl does not apply; the restarted process releases the leases and claims the killed one left when it opens the file",
		}
	}
	keep := cfg.Keep || !ownDir
	defer func() {
		if !keep && len(rep.Violations) == 0 {
			os.RemoveAll(h.dir)
			rep.WorkDir = ""
		}
	}()
	for _, d := range []string{"bin", "redis", "artifacts", "pipelines", "logs"} {
		if err := os.MkdirAll(filepath.Join(h.dir, d), 0o755); err != nil {
			return nil, err
		}
	}

	// Binaries.
	bin := cfg.BinDir
	if bin == "" {
		bin = filepath.Join(h.dir, "bin")
		h.say("building the service binaries into %s", bin)
		t0 := time.Now()
		if err := build(ctx, bin, lay.binaries); err != nil {
			keep = true
			return nil, err
		}
		rep.Build = time.Since(t0).Round(time.Millisecond).String()
	}
	for _, b := range lay.binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w", b, err)
		}
	}
	// On bbolt the one handoff binary needs crash points whatever the target: a release
	// build refuses up's test-only -via flags, which put the hop proxy in place.
	if cfg.uses(TargetLedger) || lay.oneProcess {
		if err := checkCrashpoints(filepath.Join(bin, lay.crashBin)); err != nil {
			if lay.oneProcess {
				err = fmt.Errorf("%w; on bbolt, with any target: handoff up's test-only --test-agentrunner-via and --test-writeback-via are only in such a build", err)
			}
			return nil, err
		}
	}

	// Redis, with an fsynced append-only file so a restart keeps every acknowledged write;
	// or a cluster whose nodes keep one each.
	var storeURL string
	switch cfg.Store {
	case StoreBolt:
		// The one process's file, in its --data folder; read again (the ledger) once it
		// stopped.
		storeURL = filepath.Join(h.dir, "data", "handoff.db")
	case StoreCluster:
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		h.cluster, err = rediscluster.Start(cctx, rediscluster.Options{Dir: filepath.Join(h.dir, "redis"), NodeTimeout: clusterNodeTimeout,
			AppendOnly: true, Server: redisPath})
		cancel()
		if err != nil {
			keep = true
			return nil, fmt.Errorf("chaos: start the Redis Cluster: %w", err)
		}
		defer h.cluster.Stop()
		storeURL = "redis-cluster://" + strings.Join(h.cluster.Addrs(), ",")
		if cfg.Wait {
			storeURL += "?wait=1"
		}
		h.say("redis cluster (3 masters, 3 replicas, node timeout %s) on %s", clusterNodeTimeout, strings.Join(h.cluster.Addrs(), " "))
	default:
		rport, err := freePort()
		if err != nil {
			return nil, err
		}
		h.redis = &redisProc{bin: redisPath, dir: filepath.Join(h.dir, "redis"), port: rport, addr: fmt.Sprintf("127.0.0.1:%d", rport), restarts: &h.restarts}
		if err := h.redis.start(); err != nil {
			keep = true
			return nil, err
		}
		defer h.redis.stop()
		storeURL = "redis://" + h.redis.addr + "/0"
		h.say("redis-server on %s (append-only, fsync always) in %s", h.redis.addr, h.redis.dir)
	}
	h.storeURL = storeURL

	// The deployment's service-token keys (plaintext on loopback): one private key per
	// service, as `handoff keys` makes them, and the folder of public keys they all verify
	// with. The hop proxy calls the runner and the writeback as the coordinator, with the
	// coordinator's key. Then the pipelines: the shipped support ticket, whose writeback
	// stage writes to the ledger, and a variant of it under another name on the webhook
	// target (the sink).
	//
	// On bbolt `handoff up` makes its services' keys itself and never shows them: the hop
	// proxy passes the coordinator's own token on, as the network does.
	keyDir := filepath.Join(h.dir, "keys")
	var signer *identity.Signer
	if !lay.oneProcess {
		if _, err := identity.GenerateKeys(keyDir, lay.binaries, false); err != nil {
			return nil, err
		}
		coordKey, err := identity.LoadPrivateKey(identity.KeyFile(keyDir, "coordinator"))
		if err != nil {
			return nil, err
		}
		if signer, err = identity.NewSigner("coordinator", coordKey); err != nil {
			return nil, err
		}
	}
	// The operator token: the harness reads the runs it submitted as an operator would.
	opToken := rand.Text()
	pl, err := pipelines.FS.ReadFile("support-ticket.yaml")
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(pl), "target: ledger") || !strings.Contains(string(pl), "\nname: "+ledgerPipeline+"\n") {
		return nil, errors.New("chaos: the shipped support-ticket pipeline is no longer named " + ledgerPipeline + " or no longer writes to target ledger; update the harness")
	}
	variants := map[string][]byte{}
	if cfg.uses(TargetLedger) {
		variants[ledgerPipeline] = pl
	}
	if cfg.uses(TargetSink) {
		v := strings.Replace(string(pl), "target: ledger", "target: webhook", 1)
		variants[sinkPipeline] = []byte(strings.Replace(v, "\nname: "+ledgerPipeline+"\n", "\nname: "+sinkPipeline+"\n", 1))
	}
	plDir := filepath.Join(h.dir, "pipelines")
	if cfg.uses(TargetLedger) {
		fan, err := pipelines.FS.ReadFile(fanPipeline + ".yaml")
		if err != nil {
			return nil, err
		}
		parsed, problems, err := pipeline.Parse(fanPipeline+".yaml", fan)
		if err != nil || pipeline.HasErrors(problems) || !strings.Contains(string(fan), "target: ledger") {
			return nil, fmt.Errorf("chaos: the shipped %s pipeline does not load or no longer writes to target ledger: %v %v", fanPipeline, err, problems)
		}
		h.fanHops = parsed.MaxHops
		if err := os.WriteFile(filepath.Join(plDir, fanPipeline+".yaml"), fan, 0o644); err != nil {
			return nil, err
		}
	}
	for name, text := range variants {
		parsed, problems, err := pipeline.Parse(name+".yaml", text)
		if err != nil || pipeline.HasErrors(problems) {
			return nil, fmt.Errorf("chaos: the %s variant of support-ticket.yaml does not load: %v %v", name, err, problems)
		}
		h.maxHops = parsed.MaxHops
		if err := os.WriteFile(filepath.Join(plDir, name+".yaml"), text, 0o644); err != nil {
			return nil, err
		}
	}
	arts, err := artifact.NewFiles(lay.artifacts(h.dir))
	if err != nil {
		return nil, err
	}

	// The external system and the hop proxy.
	h.sink = newSink()
	if err := h.sink.start(); err != nil {
		return nil, err
	}
	defer h.sink.close()
	var ports [4]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	runnerAddr, wbAddr := addr(0), addr(1)
	h.proxy = &proxy{h: h, passAuth: lay.oneProcess}
	// The proxy is the coordinators' network: it dials the services again after a restart
	// as a coordinator does (rpc.Reconnect), so their resume times are the product's.
	asCoordinator := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(rpc.Reconnect)}
	if signer != nil {
		asCoordinator = append(asCoordinator, grpc.WithPerRPCCredentials(signer.PerRPCCredentials()))
	}
	rc, err := grpc.NewClient(runnerAddr, asCoordinator...)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	wc, err := grpc.NewClient(wbAddr, asCoordinator...)
	if err != nil {
		return nil, err
	}
	defer wc.Close()
	h.proxy.runner, h.proxy.wb = handoffv1.NewAgentRunnerServiceClient(rc), handoffv1.NewWritebackServiceClient(wc)
	if err := h.proxy.start(); err != nil {
		return nil, err
	}
	defer h.proxy.close()

	// The services.
	logDir := filepath.Join(h.dir, "logs")
	artDir := arts.Root()
	if lay.oneProcess {
		if err := h.mkOneProcess(filepath.Join(bin, "handoff"), filepath.Join(h.dir, "data"), logDir, runnerAddr, wbAddr, addr(2), plDir, opToken); err != nil {
			return nil, err
		}
	} else if err := h.mkServices(bin, keyDir, storeURL, logDir, artDir, runnerAddr, wbAddr, addr, plDir, opToken); err != nil {
		return nil, err
	}
	if cfg.uses(TargetLedger) {
		hook, stopHook, err := crashpoint.Serve(h.visit)
		if err != nil {
			return nil, err
		}
		defer stopHook()
		h.writeback.env = []string{crashpoint.HookEnv + "=" + hook}
	}
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		var wg sync.WaitGroup
		for _, p := range h.procs {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(30 * time.Second) }()
		}
		wg.Wait()
	}
	defer stopAll()
	for _, p := range h.procs {
		go p.supervise()
	}
	if err := h.waitUp(60 * time.Second); err != nil {
		keep = true
		return nil, err
	}
	var coordAddrs []string
	for _, c := range h.coords {
		coordAddrs = append(coordAddrs, c.addr)
	}
	h.say("services up (%s): coordinator %s, agentrunner %s, writeback %s (target %s; webhook -> %s), hop proxy %s; logs in %s",
		lay.name, strings.Join(coordAddrs, " "), runnerAddr, wbAddr, cfg.Target, h.sink.url, h.proxy.addr, logDir)
	h.sink.setOnApply(func() {
		h.writes.Add(1)
		h.killWriteback(killAtSink, "after the sink applied a write, before it answered")
	})
	h.plan()

	// The jobs.
	var clients []handoffv1.CoordinatorServiceClient
	for _, c := range h.coords {
		cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(identity.OperatorCredentials(opToken)))
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		clients = append(clients, handoffv1.NewCoordinatorServiceClient(cc))
	}
	ledgerJobs := 0
	for i := range cfg.Jobs {
		h.jobTarget[jobID(i)] = cfg.targetOf(i)
		// Every fourth ledger job fans out (research-brief: two branches, a merge, a sub-job).
		if h.jobTarget[jobID(i)] == TargetLedger {
			if ledgerJobs++; ledgerJobs%4 == 0 {
				h.fanJobs[jobID(i)] = true
			}
		}
	}
	start := time.Now()
	results := h.runJobs(ctx, clients, arts)
	rep.Duration = time.Since(start).Round(time.Millisecond).String()
	h.proxy.wait(40 * time.Second)
	h.waitFaults()

	h.say("stopping the services with SIGTERM (they drain)")
	stopAll()
	var ledger []store.LedgerEntry
	if cfg.uses(TargetLedger) {
		if ledger, err = h.readLedger(ctx); err != nil {
			keep = true
			return nil, err
		}
	}
	h.finish(rep, results, newLedgerBook(ledger))
	if f, err := os.Create(filepath.Join(h.dir, "sink.jsonl")); err == nil {
		h.sink.dump(f)
		f.Close()
	}
	return rep, nil
}

// waitFaults waits for a coordinator kill or Redis restart still under way.
func (h *harness) waitFaults() {
	for {
		h.planMu.Lock()
		busy := h.busy[faultCoordinator] || h.busy[faultRedis]
		h.planMu.Unlock()
		if !busy {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitUp waits until every service answers SERVING.
func (h *harness) waitUp(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var down []*proc
		for _, p := range h.procs {
			if !p.up() {
				down = append(down, p)
			}
		}
		if len(down) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			p := down[0]
			return fmt.Errorf("chaos: %s did not become healthy within %s; last lines of %s:\n%s", p.name, within, p.logPath, logTail(p.logPath, 15))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plan spreads each kind's faults evenly over the expected hops (six per job is a little
// under what a support ticket takes, so the last faults fire before the run ends).
func (h *harness) plan() {
	expected := float64(6 * h.cfg.Jobs)
	place := func(kind, n int) {
		for i := range n {
			h.at[kind] = append(h.at[kind], int64((float64(i)+planOffsets[kind])*expected/float64(n)))
		}
	}
	place(faultRunner, h.cfg.Kills)
	place(faultCoordinator, h.cfg.Kills)
	// The writeback's kills over the first two thirds of the expected writes (one per job),
	// so the last one still finds writes after it.
	for i := range h.cfg.Kills {
		h.at[faultWriteback] = append(h.at[faultWriteback], int64((float64(i)+planOffsets[faultWriteback])*float64(2*h.cfg.Jobs)/float64(3*h.cfg.Kills)))
	}
	place(faultRedis, h.cfg.RedisRestarts)
}

// due reports whether the next fault of kind is due now and its target is up, and if so
// takes it off the plan.
func (h *harness) due(kind int) bool {
	h.planMu.Lock()
	defer h.planMu.Unlock()
	return h.dueLocked(kind)
}

func (h *harness) dueLocked(kind int) bool {
	clock := h.hops.Load()
	if kind == faultWriteback {
		clock = h.writes.Load()
	}
	if h.next[kind] >= len(h.at[kind]) || h.busy[kind] || clock < h.at[kind][h.next[kind]] {
		return false
	}
	switch kind {
	case faultRunner:
		if !h.runner.up() {
			return false
		}
	case faultWriteback:
		if !h.writeback.up() {
			return false
		}
	case faultCoordinator:
		for _, c := range h.coords { // kill one while the other runs: it must take over
			if !c.up() {
				return false
			}
		}
	}
	h.next[kind]++
	return true
}

// hop counts a call through the proxy, and its hop (key) the first time it is seen, and
// fires the coordinator kills and Redis restarts that are due (in the background: the call
// goes on).
// It reports whether the hop is new (its first call, not a retry).
func (h *harness) hop(key string) (first bool) {
	h.calls.Add(1)
	if _, seen := h.seen.LoadOrStore(key, struct{}{}); !seen {
		h.hops.Add(1)
		first = true
	}
	h.planMu.Lock()
	defer h.planMu.Unlock()
	if h.dueLocked(faultCoordinator) {
		h.busy[faultCoordinator] = true
		victim := h.coords[(h.next[faultCoordinator]-1)%len(h.coords)]
		go func() {
			h.killProc(victim, kindCoordinator, "mid-job")
			h.planMu.Lock()
			h.busy[faultCoordinator] = false
			h.planMu.Unlock()
		}()
	}
	if h.dueLocked(faultRedis) {
		h.busy[faultRedis] = true
		go func() {
			if h.cluster != nil {
				h.killMaster()
			} else {
				h.say("restarting redis-server (SIGKILL, down %s) at hop %d", redisDown, h.hops.Load())
				h.resumes.killed(kindRedis)
				if err := h.redis.restart(redisDown); err != nil {
					h.say("redis-server did not come back: %v", err)
				}
			}
			h.planMu.Lock()
			h.busy[faultRedis] = false
			h.planMu.Unlock()
		}()
	}
	return first
}

func (h *harness) killRunner() {
	h.killProc(h.runner, kindRunner, "mid-stage (after ACCEPTED, before the result)")
}

// killMaster SIGKILLs a master of the cluster (the next in turn), waits for its replica's
// promotion, and starts the killed node again (it rejoins as a replica).
func (h *harness) killMaster() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	masters, err := h.cluster.Masters(ctx)
	if err != nil || len(masters) == 0 {
		h.say("no master to kill: %v", err)
		return
	}
	slices.Sort(masters)
	victim := masters[int(h.restarts.Load())%len(masters)]
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: h.cluster.Addrs(), MaxRetries: -1, ClusterStateReloadInterval: time.Second})
	defer rdb.Close()
	pr, err := startProbe(ctx, rdb, victim, h.cfg.Wait, int(h.restarts.Load()))
	if err != nil {
		h.say("replication probe on %s: %v", victim, err)
	}
	time.Sleep(200 * time.Millisecond) // the probe writes up to the kill
	h.say("SIGKILL redis master %s at hop %d", victim, h.hops.Load())
	h.resumes.killed(kindMaster)
	t0 := time.Now()
	if err := h.cluster.Kill(victim); err != nil {
		h.say("kill master %s: %v", victim, err)
		return
	}
	var acked []string
	if pr != nil {
		acked = pr.end()
	}
	h.restarts.Add(1)
	if err := h.cluster.WaitFailover(ctx, victim); err != nil {
		h.say("%v", err)
	} else {
		d := time.Since(t0)
		h.planMu.Lock()
		h.failovers = append(h.failovers, d)
		h.planMu.Unlock()
		h.say("replica of %s promoted: the cluster is whole %s after the kill", victim, d.Round(time.Millisecond))
		if lost, err := countLost(ctx, rdb, acked); err != nil {
			h.say("replication probe: count: %v", err)
		} else {
			h.planMu.Lock()
			h.probe.Acknowledged += len(acked)
			h.probe.Lost += lost
			h.planMu.Unlock()
			h.say("replication probe: %d of %d acknowledged writes to %s lost in the failover (wait for replica: %v)", lost, len(acked), victim, h.cfg.Wait)
		}
	}
	time.Sleep(redisDown)
	if err := h.cluster.Restart(victim); err != nil {
		h.say("restart %s: %v", victim, err)
	}
}

// killProc SIGKILLs p as a kill of kind (a service: on bbolt p is the one process, and kind
// says where it was killed) and counts it. A kill that finds p already down (on bbolt,
// killed for another kind a moment ago) goes back to the plan, to be made at the next
// chance, and opens no outage.
func (h *harness) killProc(p *proc, kind, when string) bool {
	if p.kill(func() { h.resumes.killed(kind) }) {
		h.planMu.Lock()
		h.killCount[kind]++
		h.planMu.Unlock()
		as := "" // on bbolt the one process is killed as one of its services
		if p.kind != kind {
			as = " as " + kind
		}
		h.say("SIGKILL %s%s %s at hop %d", p.name, as, when, h.hops.Load())
		return true
	}
	h.planMu.Lock()
	if f, ok := faultOfKind[kind]; ok && h.next[f] > 0 {
		h.next[f]--
	}
	h.planMu.Unlock()
	return false
}

// faultOfKind is the plan's fault of each kind of service kill.
var faultOfKind = map[string]int{kindRunner: faultRunner, kindCoordinator: faultCoordinator, kindWriteback: faultWriteback}

// jobResult is one job's outcome.
type jobResult struct {
	id    string
	runID string
	job   *handoffv1.Job
	err   error
	// rerun counts the branches of a fan-out job delivered again after they completed.
	rerun int
}

// runJobs submits the jobs, at most Concurrency in flight, and waits for each to end.
func (h *harness) runJobs(ctx context.Context, clients []handoffv1.CoordinatorServiceClient, arts *artifact.Files) []*jobResult {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Deadline)
	defer cancel()
	results := make([]*jobResult, h.cfg.Jobs)
	sem := make(chan struct{}, h.cfg.Concurrency)
	var wg sync.WaitGroup
	var ended atomic.Int64
	stopProgress := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				h.say("%4ds: %d/%d jobs ended, %d hops (%d calls), kills %s, redis restarts %d", int(time.Since(start).Seconds()),
					ended.Load(), h.cfg.Jobs, h.hops.Load(), h.calls.Load(), h.killSummary(), h.restarts.Load())
			}
		}
	}()
	defer close(stopProgress)
	h.say("submitting %d jobs, %d at a time, deadline %s", h.cfg.Jobs, h.cfg.Concurrency, h.cfg.Deadline)
	for i := range h.cfg.Jobs {
		r := &jobResult{id: jobID(i)}
		results[i] = r
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			r.err = fmt.Errorf("not submitted: %w", ctx.Err())
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer ended.Add(1)
			h.runJob(ctx, clients, arts, i, r)
		}()
	}
	wg.Wait()
	return results
}

func (h *harness) runJob(ctx context.Context, clients []handoffv1.CoordinatorServiceClient, arts *artifact.Files, i int, r *jobResult) {
	input, err := arts.Put(ctx, artifact.Ref{JobID: r.id, Stage: "submit", Type: support.TypeRawTicket, SchemaVersion: support.SchemaRawTicket, MediaType: support.MediaJSON}, support.SampleTicket())
	if err != nil {
		r.err = fmt.Errorf("store the ticket: %w", err)
		return
	}
	pl := ledgerPipeline
	if h.jobTarget[r.id] == TargetSink {
		pl = sinkPipeline
	}
	if h.fanJobs[r.id] {
		pl = fanPipeline
	}
	req := &handoffv1.SubmitJobRequest{
		RequestId: r.id, JobId: r.id, Pipeline: pl, Goal: demo.Goal, Constraints: demo.Constraints,
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_200_000}, Inputs: []*handoffv1.Artifact{input},
		MemoryRefs: []string{"customer_id:cus_9"},
	}
	// Submit, to either replica: the request id makes a retry return the run already made.
	for attempt := 0; r.runID == ""; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := clients[(i+attempt)%len(clients)].SubmitJob(cctx, req)
		cancel()
		if err == nil {
			r.runID = resp.GetJob().GetRunId()
			break
		}
		r.err = fmt.Errorf("submit: %w", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	r.err = nil
	// Wait for the end, reading the run from either replica.
	for attempt := 0; ; attempt++ {
		select {
		case <-ctx.Done():
			r.err = fmt.Errorf("not terminal by the deadline: %w", ctx.Err())
			return
		case <-time.After(300 * time.Millisecond):
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := clients[(i+attempt)%len(clients)].GetJob(cctx, &handoffv1.GetJobRequest{RunId: r.runID})
		cancel()
		if err != nil {
			continue
		}
		r.job = resp.GetJob()
		switch r.job.GetState() {
		case handoffv1.JobState_JOB_STATE_COMPLETED, handoffv1.JobState_JOB_STATE_ESCALATED, handoffv1.JobState_JOB_STATE_FAILED:
			if h.fanJobs[r.id] {
				h.countReruns(ctx, clients[(i+attempt)%len(clients)], r)
			}
			return
		}
	}
}

func (h *harness) killSummary() string {
	k := h.kills()
	return fmt.Sprintf("coordinator %d, agentrunner %d, writeback %d", k["coordinator"], k["agentrunner"], k["writeback"])
}

func (h *harness) kills() map[string]int {
	out := map[string]int{kindCoordinator: 0, kindRunner: 0, kindWriteback: 0}
	h.planMu.Lock()
	defer h.planMu.Unlock()
	maps.Copy(out, h.killCount)
	return out
}

// countReruns reads a fan-out job's events and counts the branches the rail delivered again
// after their BRANCH_ENDED: a completed branch is never run again, whoever drives the run.
func (h *harness) countReruns(ctx context.Context, client handoffv1.CoordinatorServiceClient, r *jobResult) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	evs, err := demo.Watch(cctx, client, r.runID, nil)
	if err != nil {
		return // the run is terminal: its job is counted; its events are best effort
	}
	ended := map[string]bool{}
	for _, ev := range evs {
		switch {
		case ev.GetBranch() == "":
		case ev.GetKind() == handoffv1.EventKind_EVENT_KIND_BRANCH_ENDED:
			ended[ev.GetBranch()] = true
		case ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ended[ev.GetBranch()]:
			r.rerun++
		}
	}
}

// jobID is job i's id.
func jobID(i int) string { return fmt.Sprintf("chaos_%05d", i+1) }

// finish fills the report and its violations.
func (h *harness) finish(rep *Report, results []*jobResult, ledger *ledgerBook) {
	rep.Kills = h.kills()
	h.planMu.Lock()
	rep.WritebackKillsAt = maps.Clone(h.killsAt)
	h.planMu.Unlock()
	rep.Crashes = map[string]int{}
	rep.Stops = map[string]string{}
	for _, p := range h.procs {
		rep.Crashes[p.kind] += p.crashes
		rep.Stops[p.name] = p.stopped
	}
	rep.RedisRestarts = int(h.restarts.Load())
	rep.TimeToResume = h.resumes.report()
	h.planMu.Lock()
	if h.cluster != nil {
		pr := h.probe
		rep.ReplicationProbe = &pr
	}
	for _, d := range h.failovers {
		rep.FailoverMs = append(rep.FailoverMs, d.Milliseconds())
	}
	h.planMu.Unlock()
	rep.Hops, rep.Calls = h.hops.Load(), h.calls.Load()
	rep.Redelivery = h.proxy.report()
	rep.Sink = h.sink.report()
	rep.Escalations, rep.Failures = map[string]int{}, map[string]int{}
	for _, r := range results {
		if r.runID != "" {
			rep.Jobs.Submitted++
		}
		st := r.job.GetState()
		written := h.sink.writesFor(r.id) > 0
		if h.jobTarget[r.id] == TargetLedger {
			written = ledger.perJob[r.id] > 0
		}
		rep.BranchesRerun += r.rerun
		if h.fanJobs[r.id] {
			rep.FanoutJobs++
		}
		if r.job != nil && r.err == nil {
			// The wallet paid the run's own hops and its sub-jobs'.
			made, max := int(r.job.GetHops()), h.maxHops
			if h.fanJobs[r.id] {
				max = h.fanHops
				for _, c := range r.job.GetChildren() {
					made += int(c.GetHops())
				}
			}
			if extra := max - int(r.job.GetWallet().GetHopsRemaining()) - made; extra > 0 {
				rep.OverchargedJobs++
				rep.ExtraHopDebits += extra
			}
		}
		switch {
		case r.err != nil || r.job == nil:
			rep.Jobs.Lost++
			msg := r.id
			if r.err != nil {
				msg += ": " + r.err.Error()
			}
			rep.Jobs.LostJobs = append(rep.Jobs.LostJobs, msg)
			continue
		case st == handoffv1.JobState_JOB_STATE_COMPLETED:
			rep.Jobs.Completed++
			if !written {
				rep.CompletedWithoutWrite++
			}
			if h.jobTarget[r.id] == TargetLedger {
				ledger.checkReceipt(r.job)
			}
			continue
		case st == handoffv1.JobState_JOB_STATE_ESCALATED:
			rep.Jobs.Escalated++
			rep.Escalations[strings.TrimPrefix(r.job.GetEscalation().GetCause().String(), "ESCALATION_CAUSE_")+": "+clip(r.job.GetEscalation().GetDetail(), 90)]++
		case st == handoffv1.JobState_JOB_STATE_FAILED:
			rep.Jobs.Failed++
			rep.Failures[clip(r.job.GetEscalation().GetDetail(), 120)]++
		}
		if written {
			rep.WrittenNotCompleted++
		}
	}
	sort.Strings(rep.Jobs.LostJobs)
	rep.Ledger = ledger.report
	v := &rep.Violations
	if rep.Jobs.Lost > 0 {
		*v = append(*v, fmt.Sprintf("%d jobs lost (not terminal by the deadline, or never submitted)", rep.Jobs.Lost))
	}
	if rep.Sink.DoubleWrites > 0 {
		*v = append(*v, fmt.Sprintf("%d double writes: a job written again under another key or without one", rep.Sink.DoubleWrites))
	}
	if rep.Sink.Conflicts > 0 {
		*v = append(*v, fmt.Sprintf("%d re-sent writes changed the body of a key already applied", rep.Sink.Conflicts))
	}
	if rep.Ledger.DoubleWrites > 0 {
		*v = append(*v, fmt.Sprintf("%d ledger double writes: a job with more than one entry", rep.Ledger.DoubleWrites))
	}
	// On one Redis the ledger entry and its receipt are one script, so a writeback killed
	// anywhere leaves both or neither and a re-offer is the writeback's fault. On a cluster
	// they are in two slots, two steps (store.Redis.AppendLedgerComplete): a kill, or a
	// master's failover, between them leaves the entry without its receipt, and the retry
	// offers it again, absorbed by the ledger's key. That is the design there (the target's
	// key closes the gap), so it is reported, not a violation.
	if rep.Ledger.Reoffered > 0 && h.cluster == nil {
		*v = append(*v, fmt.Sprintf("%d ledger writes offered again for a key already written (absorbed by the ledger, but let through by the writeback)", rep.Ledger.Reoffered))
	}
	if rep.Ledger.ReceiptMismatches > 0 {
		*v = append(*v, fmt.Sprintf("%d completed ledger jobs hold a receipt that names another entry than their key's", rep.Ledger.ReceiptMismatches))
	}
	if rep.BranchesRerun > 0 {
		*v = append(*v, fmt.Sprintf("%d branches delivered again after they had completed", rep.BranchesRerun))
	}
	if rep.CompletedWithoutWrite > 0 {
		*v = append(*v, fmt.Sprintf("%d completed jobs have no write in their external system", rep.CompletedWithoutWrite))
	}
	for kind, n := range rep.Kills {
		if n < rep.KillsAsked {
			*v = append(*v, fmt.Sprintf("fault plan not carried out: %s killed %d times of %d", kind, n, rep.KillsAsked))
		}
	}
	if rep.RedisRestarts < rep.RedisRestartsAsked {
		*v = append(*v, fmt.Sprintf("fault plan not carried out: redis-server restarted %d times of %d", rep.RedisRestarts, rep.RedisRestartsAsked))
	}
	sort.Strings(*v)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// rngDo runs f on the harness's seeded generator.
func rngDo[T any](h *harness, f func(r *mrand.Rand) T) T {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return f(h.rng)
}
