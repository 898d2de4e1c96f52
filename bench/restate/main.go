// Command restate is the Restate peer of issue 22: the same 5-stage relay of no-op stages
// as handoff's job figure J, in Restate's two shapes, run side by side with J_bolt and
// J_redis (bench.RunJobs) in one process, interleaved in rounds:
//
//   - hop: a Relay handler making 5 durable service-to-service calls to a Stage service
//     (each a new invocation Restate journals, the equivalent of a handoff hop);
//   - inline: a Relay handler running 5 journaled restate.Run steps (no hop).
//
// It is its own Go module so that the Restate SDK never enters the main module's
// dependencies or its `go test ./...`. Run it from this folder:
//
//	cd bench/restate && go run . [--jobs 96] [--serial 15] [--concurrency 32] [--rounds 3] [--restate PATH] [--redis off] [--json]
//
// It starts restate-server 1.7.12 (from npm: `npm install` in this folder, done for you when
// node_modules lacks it) as a subprocess in its own process group, single node, default
// configuration but for loopback TCP listeners on free ports, with its data in a temporary
// folder; serves the Go SDK's HTTP/2 endpoint in this process on a free port; registers it
// with the admin API; and kills the server at the end.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/ingress"
	"github.com/restatedev/sdk-go/server"

	"github.com/handoffhq/handoff/internal/bench"
	"github.com/handoffhq/handoff/internal/bench/peer"
	"github.com/handoffhq/handoff/internal/gctune"
)

const (
	stages = 5
	// restateVersion is the server the npm package.json in this folder pins.
	restateVersion = "1.7.12"
	// temporalJPS and temporalP50ms are tuned Temporal's figures on this machine kind (issue
	// 22, /work/shared/ANCHORS.md; bench/temporal measures them): J_redis is judged against
	// them, not against a Temporal run here. `handoff bench` judges J_redis by the same ones.
	temporalJPS   = bench.TemporalJobsPerSec
	temporalP50ms = 30.0
)

// stage is one no-op stage: it returns its input plus one, so a relay's answer proves that
// all five ran in order.
func stage(_ restate.Context, n int) (int, error) { return n + 1, nil }

// hopRelay is the hop-equivalent shape: five durable calls to the Stage service, one after
// another.
func hopRelay(ctx restate.Context, n int) (int, error) {
	for range stages {
		var err error
		if n, err = restate.Service[int](ctx, "Stage", "Run").Request(n); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// inlineRelay is the in-handler shape: five journaled restate.Run steps.
func inlineRelay(ctx restate.Context, n int) (int, error) {
	for range stages {
		var err error
		if n, err = restate.Run(ctx, func(restate.RunContext) (int, error) { return n + 1, nil }); err != nil {
			return 0, err
		}
	}
	return n, nil
}

type options struct {
	jobs, serial, conc, rounds int
	restateBin, redis          string
	jsonOut                    bool
}

// ratio compares a handoff figure with a peer's: handoff's jobs/s over the peer's, and the
// peer's p50 over handoff's (both "how many times better"), against the targets.
type ratio struct {
	Name            string  `json:"name"`
	Handoff         string  `json:"handoff"`
	Peer            string  `json:"peer"`
	ThroughputRatio float64 `json:"handoff_jobs_per_sec_over_peer"`
	LatencyRatio    float64 `json:"peer_p50_over_handoff_p50"`
	// Targets: 0 = none stated for this pair.
	ThroughputTarget float64 `json:"throughput_target,omitempty"`
	LatencyTarget    float64 `json:"latency_target,omitempty"`
	ThroughputMet    *bool   `json:"throughput_met,omitempty"`
	LatencyMet       *bool   `json:"latency_met,omitempty"`
	// The same two ratios in each round alone (when both figures have their rounds), and how
	// many of those rounds met each target: on a shared machine the medians hide the spread.
	ThroughputRounds    []float64 `json:"rounds_jobs_per_sec_ratio,omitempty"`
	LatencyRounds       []float64 `json:"rounds_p50_ratio,omitempty"`
	ThroughputRoundsMet *int      `json:"throughput_rounds_met,omitempty"`
	LatencyRoundsMet    *int      `json:"latency_rounds_met,omitempty"`
	// The most jobs/s handoff's side could reach here at its own CPU per job with every
	// CPU busy (peer.CPUCeiling), and that over the peer's jobs/s: a throughput target
	// above the latter is out of reach until handoff's CPU per job falls, whatever the disk.
	CPUCeiling         float64 `json:"handoff_cpu_ceiling_jobs_per_sec,omitempty"`
	CPUCeilingOverPeer float64 `json:"handoff_cpu_ceiling_over_peer,omitempty"`
	Note               string  `json:"note,omitempty"`
}

type report struct {
	peer.Header
	Restate string         `json:"restate_server"`
	Wall    string         `json:"wall"`
	Figures []*peer.Figure `json:"figures"`
	Ratios  []ratio        `json:"ratios"`
	Notes   []string       `json:"notes,omitempty"`
	// Settle is how long each measured phase waited for restate-server and this process
	// to go quiet.
	Settle peer.SettleLog `json:"peer_settle"`
}

func main() {
	// handoff's side runs with the GC policy its binaries ship with (the peer's worker in
	// this process gets it too).
	if _, err := gctune.Apply(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var o options
	flag.IntVar(&o.jobs, "jobs", 96, "jobs per round with --concurrency in flight (jobs/s)")
	flag.IntVar(&o.serial, "serial", 15, "jobs per round one at a time (p50, p99)")
	flag.IntVar(&o.conc, "concurrency", 32, "jobs in flight for jobs/s")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds (each figure runs once per round and mode)")
	flag.StringVar(&o.restateBin, "restate", "", "restate-server binary (default: node_modules/.bin/restate-server here, installed with npm when missing)")
	flag.StringVar(&o.redis, "redis", bench.DefaultRedisAddr, `Redis for handoff J_redis ("off" to skip)`)
	flag.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	flag.Parse()
	if o.jobs <= 0 || o.serial <= 0 || o.conc <= 0 || o.rounds <= 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "restate: --jobs, --serial, --concurrency and --rounds must be positive, and no arguments are taken")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "restate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	progress := func(format string, args ...any) {
		if !o.jsonOut {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	bin, err := findRestate(ctx, o.restateBin, progress)
	if err != nil {
		return err
	}
	rep := &report{Header: peer.NewHeader(o.jobs, o.serial, o.conc, o.rounds), Settle: peer.NewSettleLog(peer.DefaultQuiet)}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		rep.Restate = string(bytes.TrimSpace(out))
	}

	// The SDK endpoint: Stage and Relay, HTTP/2 without TLS on a free loopback port.
	rs := server.NewRestate().WithLogger(slog.NewTextHandler(io.Discard, nil), true).
		Bind(restate.NewService("Stage").Handler("Run", restate.NewServiceHandler(stage))).
		Bind(restate.NewService("Relay").
			Handler("Hop", restate.NewServiceHandler(hopRelay)).
			Handler("Inline", restate.NewServiceHandler(inlineRelay)))
	h, err := rs.Handler()
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	sdk := &http.Server{Handler: h, Protocols: &protocols, ReadHeaderTimeout: 5 * time.Second}
	go sdk.Serve(lis)
	defer sdk.Close()

	srv, err := startServer(bin)
	if err != nil {
		return err
	}
	defer srv.stop()
	if err := srv.ready(ctx); err != nil {
		return err
	}
	if err := register(ctx, srv.admin, "http://"+lis.Addr().String()); err != nil {
		return err
	}
	// Enough idle connections for every job in flight (the default keeps 2 per host).
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * o.conc, MaxIdleConnsPerHost: 2 * o.conc, IdleConnTimeout: time.Minute}}
	ic := ingress.NewClient(srv.ingress, ingress.WithHttpClient(hc))
	job := func(handler string) func(context.Context, int) error {
		req := ingress.Service[int, int](ic, "Relay", handler)
		return func(ctx context.Context, _ int) error {
			got, err := req.Request(ctx, 0)
			if err == nil && got != stages {
				err = fmt.Errorf("the relay handler %s returned %d, want %d (every stage once, in order)", handler, got, stages)
			}
			return err
		}
	}
	peers := []struct {
		f  *peer.Figure
		op func(context.Context, int) error
	}{
		{&peer.Figure{Key: "restate_hop", Name: "Restate: 5 durable service calls (hop-equivalent)"}, job("Hop")},
		{&peer.Figure{Key: "restate_inline", Name: "Restate: 5 restate.Run steps in one handler (no hop)"}, job("Inline")},
	}
	// Warm-up: the deployment's discovery, the partitions' leaders, connections.
	for _, p := range peers {
		for range 3 {
			if err := p.op(ctx, 0); err != nil {
				return fmt.Errorf("%s warm-up: %w", p.f.Key, err)
			}
		}
	}

	stores := []string{bench.StoreBolt}
	if o.redis != "off" {
		if err := bench.RedisReachable(ctx, o.redis); err != nil {
			rep.Notes = append(rep.Notes, "J_redis skipped: "+err.Error())
		} else {
			stores = append(stores, bench.StoreRedis)
		}
	}
	handoff := map[string]*peer.Figure{}
	for _, s := range stores {
		handoff[s] = &peer.Figure{Key: "J_" + s, Name: "handoff J_" + s}
	}
	// Every measured phase, Restate's and handoff's, starts with the server and this
	// process (handoff's services, the SDK endpoint) quiet.
	settle := rep.Settle.Waiter(ctx, srv.cmd.Process.Pid, "restate-server", srv.out)
	for r := range o.rounds {
		// One at a time: p50, p99.
		serial := map[string]bench.JobsResult{}
		for _, p := range peers {
			if err := settle(); err != nil {
				return err
			}
			lat, _, err := bench.RunN(ctx, o.serial, 1, p.op)
			if err != nil {
				return fmt.Errorf("%s serial: %w", p.f.Key, err)
			}
			p50, p99 := bench.Quantiles(lat)
			serial[p.f.Key] = bench.JobsResult{P50: p50, P99: p99}
			progress("round %d: %s serial p50 %v", r+1, p.f.Key, p50)
		}
		for _, s := range stores {
			if err := settle(); err != nil {
				return err
			}
			res, err := bench.RunJobs(ctx, bench.JobsConfig{N: o.serial, Concurrency: 1, Store: s, RedisAddr: o.redis})
			if err != nil {
				return fmt.Errorf("handoff J_%s serial: %w", s, err)
			}
			serial[s] = res
			progress("round %d: handoff J_%s serial p50 %v", r+1, s, res.P50)
		}
		// conc in flight: jobs/s.
		for _, p := range peers {
			if err := settle(); err != nil {
				return err
			}
			_, el, err := bench.RunN(ctx, o.jobs, o.conc, p.op)
			if err != nil {
				return fmt.Errorf("%s concurrent: %w", p.f.Key, err)
			}
			jps := float64(o.jobs) / el.Seconds()
			p.f.Add(serial[p.f.Key].P50, serial[p.f.Key].P99, jps)
			progress("round %d: %s %.1f jobs/s", r+1, p.f.Key, jps)
		}
		for _, s := range stores {
			if err := settle(); err != nil {
				return err
			}
			res, err := bench.RunJobs(ctx, bench.JobsConfig{N: o.jobs, Concurrency: o.conc, Store: s, RedisAddr: o.redis})
			if err != nil {
				return fmt.Errorf("handoff J_%s concurrent: %w", s, err)
			}
			handoff[s].Add(serial[s].P50, serial[s].P99, res.JobsPerSec)
			handoff[s].AddCPU(res.CPU)
			progress("round %d: handoff J_%s %.1f jobs/s, %v CPU per job", r+1, s, res.JobsPerSec, res.CPU.Round(time.Microsecond))
		}
	}
	for _, p := range peers {
		finish(p.f)
		rep.Figures = append(rep.Figures, p.f)
	}
	for _, s := range stores {
		finish(handoff[s])
		rep.Figures = append(rep.Figures, handoff[s])
	}
	hop, inline := peers[0].f, peers[1].f
	ncpu := rep.NumCPU
	rep.Ratios = append(rep.Ratios, compare("J_bolt vs Restate hop relay", handoff[bench.StoreBolt], hop, 10, 10, ncpu, ""))
	rep.Ratios = append(rep.Ratios, compare("J_bolt vs Restate in-handler", handoff[bench.StoreBolt], inline, 0, 0, ncpu, ""))
	if f := handoff[bench.StoreRedis]; f != nil {
		rep.Ratios = append(rep.Ratios, compare("J_redis vs Restate hop relay", f, hop, 0, 0, ncpu, ""))
		temporal := &peer.Figure{Name: "Temporal (tuned dev server)", JobsPerSec: temporalJPS, P50ms: temporalP50ms}
		rep.Ratios = append(rep.Ratios, compare("J_redis vs tuned Temporal", f, temporal, bench.JobsTargetVsTemporal, 0, ncpu,
			fmt.Sprintf("Temporal's figures (%.0f jobs/s, %.0f ms p50) are issue 22's for this machine kind, not measured in this run (bench/temporal measures them)", temporalJPS, temporalP50ms)))
	}
	rep.LoadEnd = peer.Loadavg()
	rep.Wall = time.Since(start).Round(time.Millisecond).String()
	rep.Notes = append(rep.Notes,
		"one machine: restate-server (its own process), the SDK endpoint and handoff's services (this process) share its CPUs",
		"Restate: single node, default configuration (RocksDB WAL fsync on), TCP listeners on 127.0.0.1 free ports, data in a fresh temporary folder; jobs through the ingress HTTP API with the SDK's ingress client",
		"p50 and p99 from --serial jobs one at a time per round (p99 of 15 is their maximum); jobs/s from --jobs jobs with --concurrency in flight; medians over rounds",
		"handoff's CPU per job: this process's (its services and client; the SDK endpoint idles meanwhile) plus, for J_redis, the Redis server's, over the jobs in flight",
		rep.Settle.Describe("restate-server and this process"))

	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReport(rep)
	return nil
}

// compare builds a ratio of h over the peer p (whose rounds, when it has them, give the
// ratio round by round); a target of 0 is not judged. ncpu is the machine's CPUs, for
// h's CPU ceiling (when h's CPU per job was measured).
func compare(name string, h, p *peer.Figure, tThroughput, tLatency float64, ncpu int, note string) ratio {
	r := ratio{Name: name, Handoff: h.Name, Peer: p.Name, Note: note, ThroughputTarget: tThroughput, LatencyTarget: tLatency,
		ThroughputRounds: peer.RoundRatios(h.RoundsJPS, p.RoundsJPS), LatencyRounds: peer.RoundRatios(p.RoundsP50, h.RoundsP50)}
	r.ThroughputRatio = peer.Round2(peer.Over(h.JobsPerSec, p.JobsPerSec))
	r.LatencyRatio = peer.Round2(peer.Over(p.P50ms, h.P50ms))
	r.CPUCeiling, r.CPUCeilingOverPeer = peer.Ceiling(ncpu, h, p)
	if tThroughput > 0 {
		r.ThroughputMet, r.ThroughputRoundsMet = peer.Judge(r.ThroughputRatio, r.ThroughputRounds, func(v float64) bool { return v >= tThroughput })
	}
	if tLatency > 0 {
		r.LatencyMet, r.LatencyRoundsMet = peer.Judge(r.LatencyRatio, r.LatencyRounds, func(v float64) bool { return v > tLatency })
	}
	return r
}

func printReport(rep *report) {
	fmt.Printf("peer comparison: 5 sequential no-op stages per job; %s, %d CPUs, %s, load %s -> %s; wall %s\n",
		rep.Date, rep.NumCPU, rep.GoVersion, rep.Load, rep.LoadEnd, rep.Wall)
	fmt.Printf("%s\n", rep.Restate)
	fmt.Printf("%d rounds; per round %d jobs one at a time (p50, p99) and %d jobs with %d in flight (jobs/s); medians over rounds\n\n",
		rep.Rounds, rep.Serial, rep.Jobs, rep.Concurrency)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tp50 ms\tp99 ms\tjobs/s\tCPU ms/job\tp50 per round\tjobs/s per round")
	for _, f := range rep.Figures {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.1f\t%s\t%v\t%v\n", f.Name, f.P50ms, f.P99ms, f.JobsPerSec, f.CPUCell(), peer.Round1(f.RoundsP50), peer.Round1(f.RoundsJPS))
	}
	tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio\thandoff jobs/s ÷ peer jobs/s\tpeer p50 ÷ handoff p50")
	for _, r := range rep.Ratios {
		fmt.Fprintf(tw, "%s\t%.2f%s%s\t%.2f%s%s\n", r.Name,
			r.ThroughputRatio, verdict(r.ThroughputMet, ">=", r.ThroughputTarget), spread(r.ThroughputRounds, r.ThroughputRoundsMet),
			r.LatencyRatio, verdict(r.LatencyMet, ">", r.LatencyTarget), spread(r.LatencyRounds, r.LatencyRoundsMet))
	}
	tw.Flush()
	for _, r := range rep.Ratios {
		if r.CPUCeiling > 0 && r.ThroughputTarget > 0 {
			fmt.Printf("ceiling: %s: at its CPU per job, every CPU busy, %s reaches at most %.0f jobs/s, %.2f × the peer (target %g ×)\n",
				r.Name, r.Handoff, r.CPUCeiling, r.CPUCeilingOverPeer, r.ThroughputTarget)
		}
	}
	for _, r := range rep.Ratios {
		if r.Note != "" {
			fmt.Println("note:", r.Name+":", r.Note)
		}
	}
	for _, n := range rep.Notes {
		fmt.Println("note:", n)
	}
}

// spread says how a ratio moved over the rounds, and how many rounds alone met its target.
func spread(rounds []float64, met *int) string {
	if len(rounds) == 0 {
		return ""
	}
	s := fmt.Sprintf(" [rounds %.2f to %.2f", slices.Min(rounds), slices.Max(rounds))
	if met != nil {
		s += fmt.Sprintf(", %d of %d met it", *met, len(rounds))
	}
	return s + "]"
}

func verdict(met *bool, op string, target float64) string {
	switch {
	case met == nil:
		return ""
	case *met:
		return fmt.Sprintf(" (target %s %g: met)", op, target)
	}
	return fmt.Sprintf(" (target %s %g: missed)", op, target)
}

// restateServer is the restate-server subprocess, in its own process group.
type restateServer struct {
	cmd            *exec.Cmd
	dir            string
	admin, ingress string
	done           chan struct{}
	out            *peer.Tail
	once           sync.Once
}

// config is the server's configuration: loopback TCP only, on the given free ports; all
// else Restate's defaults.
func config(fabric, admin, ingress int) string {
	return fmt.Sprintf("listen-mode = \"tcp\"\nbind-ip = \"127.0.0.1\"\nbind-port = %d\n\n[admin]\nbind-port = %d\n\n[ingress]\nbind-port = %d\n", fabric, admin, ingress)
}

func startServer(bin string) (*restateServer, error) {
	ports := make([]int, 3)
	for i := range ports {
		p, err := peer.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	dir, err := os.MkdirTemp("", "handoff-bench-restate-")
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "restate.toml")
	if err := os.WriteFile(cfgPath, []byte(config(ports[0], ports[1], ports[2])), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, "--config-file", cfgPath, "--listen-mode=tcp", "--base-dir", filepath.Join(dir, "data"), "--bind-ip", "127.0.0.1", "--no-logo")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "RUST_LOG=error", "RESTATE_LOG_FILTER=error")
	t := &peer.Tail{}
	cmd.Stdout, cmd.Stderr = t, t
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &restateServer{cmd: cmd, dir: dir, done: make(chan struct{}), out: t,
		admin:   "http://127.0.0.1:" + strconv.Itoa(ports[1]),
		ingress: "http://127.0.0.1:" + strconv.Itoa(ports[2])}
	go func() { cmd.Wait(); close(s.done) }()
	return s, nil
}

// ready waits until both the admin API and the ingress answer their health checks.
func (s *restateServer) ready(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("restate-server exited: %s", s.out.String())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		last = nil
		for _, u := range []string{s.admin + "/health", s.ingress + "/restate/health"} {
			resp, err := http.Get(u)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("%s: %s", u, resp.Status)
				}
			}
			if err != nil {
				last = err
				break
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("restate-server not ready after 60 s: %v; output: %s", last, s.out.String())
}

// stop ends the server's process group (the npm launcher and the binary it starts):
// SIGTERM, then SIGKILL after 10 s; then removes its data.
func (s *restateServer) stop() {
	s.once.Do(func() {
		pgid := s.cmd.Process.Pid
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.done
		}
		os.RemoveAll(s.dir)
	})
}

// register tells the admin API about the SDK endpoint at uri.
func register(ctx context.Context, admin, uri string) error {
	body, _ := json.Marshal(map[string]any{"uri": uri, "force": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, admin+"/deployments", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("register deployment: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("register deployment %s: %s: %s", uri, resp.Status, b)
	}
	return nil
}

// findRestate returns the restate-server to run: flagPath, else this folder's npm install
// (run `npm install` from package.json when it is missing), else $PATH.
func findRestate(ctx context.Context, flagPath string, progress func(string, ...any)) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	local := filepath.Join("node_modules", ".bin", "restate-server")
	if _, err := os.Stat(local); err == nil {
		return filepath.Abs(local)
	}
	if _, err := os.Stat("package.json"); err == nil {
		if npm, err := exec.LookPath("npm"); err == nil {
			progress("installing restate-server %s with npm (once)", restateVersion)
			cmd := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund")
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				return "", fmt.Errorf("npm install: %w", err)
			}
			if _, err := os.Stat(local); err == nil {
				return filepath.Abs(local)
			}
		}
	}
	if p, err := exec.LookPath("restate-server"); err == nil {
		return p, nil
	}
	return "", errors.New("no restate-server: run `npm install` in bench/restate (package.json pins @restatedev/restate-server@" + restateVersion + "), or pass --restate PATH")
}

// finish sets f's medians, to two decimals as this report prints them.
func finish(f *peer.Figure) {
	f.Finish()
	f.P50ms, f.P99ms, f.JobsPerSec = peer.Round2(f.P50ms), peer.Round2(f.P99ms), peer.Round2(f.JobsPerSec)
}
