// Command coordinator runs the rail: the CoordinatorService over gRPC, driving each job's
// stages by calling an agent runner and the writeback service.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/gctune"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/coordinator"
)

// service is this binary's identity: its certificate name, its name in logs, traces and
// metrics.
const service = "coordinator"

const (
	about   = "runs the rail: the CoordinatorService over gRPC, driving each job's stages through an agent runner and the writeback service"
	details = `Needs transport security (--certs DIR for mTLS, or --plaintext-loopback on a loopback
--listen address with service tokens) and operator credentials (--operator-token, or operator
accounts with roles from --operators / --operators-file): it serves the calls that approve
writes. --store is a bbolt file, a redis:// URL or a redis-cluster:// node list shared with the other
services and the other coordinator replicas, which split the runs by lease.`
)

// Defaults of the coordinator's own settings.
const (
	defaultStore        = "handoff-data/coordinator.db"
	defaultHopTimeout   = 2 * time.Minute
	defaultHopRetryFor  = 3 * time.Minute
	defaultLeaseTTL     = coordinator.DefaultLeaseTTL
	defaultDrainTimeout = 30 * time.Second
	defaultPIIVault     = "handoff-data/pii-vault"
)

// settings are the coordinator's configuration, from flags with HANDOFF_* fallbacks.
type settings struct {
	listen                                          server.Listen
	store, runner, writeback, pipelines             string
	hopTimeout, hopRetryFor, leaseTTL, drainTimeout time.Duration
	healthInterval, storeWait                       time.Duration
	security                                        rpc.Security
	operatorToken, operators, operatorsFile         string
	escalationWebhook, deskURL                      string
	piiVault                                        string
}

// Bind registers every setting with its variable and default.
func (s *settings) Bind(b *config.Binder) {
	s.listen.Bind(b, "HANDOFF_COORDINATOR_LISTEN", server.CoordinatorAddr)
	b.String(&s.store, "store", "HANDOFF_STORE", defaultStore, "bbolt file, or redis://host:port[/db] or redis-cluster://host:port,host:port,... shared with the other services")
	b.String(&s.runner, "agentrunner", "HANDOFF_AGENTRUNNER_ADDR", server.RunnerAddr, "default agent runner address")
	b.String(&s.writeback, "writeback", "HANDOFF_WRITEBACK_ADDR", server.WritebackAddr, "writeback service address")
	b.String(&s.pipelines, "pipelines", "HANDOFF_PIPELINES", "", "folder of pipeline YAML files (default: the shipped pipelines)")
	b.Duration(&s.hopTimeout, "hop-timeout", "HANDOFF_HOP_TIMEOUT", defaultHopTimeout, "bound on one hop (ack and stage result)")
	b.Duration(&s.hopRetryFor, "hop-retry-for", "HANDOFF_HOP_RETRY_FOR", defaultHopRetryFor, "keep retrying a hop whose peer is down or whose claim is held this long before the run fails or escalates; longer than the runner's claim TTL and the writeback's --pending-ttl")
	b.Duration(&s.leaseTTL, "lease-ttl", "HANDOFF_LEASE_TTL", defaultLeaseTTL, "run lease: another replica takes a dead replica's runs over about this long after it died")
	b.Duration(&s.drainTimeout, "drain-timeout", "HANDOFF_DRAIN_TIMEOUT", defaultDrainTimeout, "on SIGTERM, how long hops in flight may take to finish before they are cut")
	b.Duration(&s.storeWait, "store-wait", "HANDOFF_STORE_WAIT", server.DefaultStoreWait, "at start-up, how long to keep trying a Redis store that does not answer yet (0: fail at once)")
	b.Duration(&s.healthInterval, "health-interval", "HANDOFF_HEALTH_INTERVAL", server.DefaultHealthInterval, "how often the store is pinged; health is NOT_SERVING while the ping fails")
	s.security.Bind(b)
	b.String(&s.operatorToken, "operator-token", "HANDOFF_OPERATOR_TOKEN", "", fmt.Sprintf("token of the operator account \"operator\" (a resolver), presented as authorization: Bearer <token> to ListEscalations and ResolveEscalation; at least %d bytes; this or --operators/--operators-file is required", identity.MinOperatorTokenLen))
	b.String(&s.escalationWebhook, "escalation-webhook", "HANDOFF_ESCALATION_WEBHOOK", "", "POST each escalation (run, job, cause, link; Idempotency-Key run:escalation; retried) to this URL, for pipelines naming no escalation.webhook")
	b.String(&s.deskURL, "desk-url", "HANDOFF_DESK_URL", "", "base URL of the operator page, for the link in an escalation's webhook body")
	b.String(&s.operators, "operators", "HANDOFF_OPERATORS", "", identity.AccountsHelp)
	b.String(&s.piiVault, "pii-vault", "HANDOFF_PII_VAULT", defaultPIIVault, "folder (mode 0700) where pipelines with pii.policy redact keep the personal data they take out of jobs; opened only when one does; replicas must share it")
	b.String(&s.operatorsFile, "operators-file", "HANDOFF_OPERATORS_FILE", "", "file of operator accounts, in the format of --operators")
}

// Validate checks the values, naming the flag of a bad one.
func (s *settings) Validate() error {
	// Fail closed before anything else: this binary serves the calls that approve writes,
	// and without operator credentials nobody could be told apart from an operator.
	if s.operatorToken == "" && s.operators == "" && s.operatorsFile == "" {
		return errors.New("no operator credentials: set --operator-token (or HANDOFF_OPERATOR_TOKEN), or operator accounts with --operators or --operators-file; ListEscalations and ResolveEscalation need an operator")
	}
	if s.operatorToken != "" && len(s.operatorToken) < identity.MinOperatorTokenLen {
		return fmt.Errorf("--operator-token is %d bytes, need at least %d", len(s.operatorToken), identity.MinOperatorTokenLen)
	}
	for flag, v := range map[string]string{"--escalation-webhook": s.escalationWebhook, "--desk-url": s.deskURL} {
		if u, err := url.Parse(v); v != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			return fmt.Errorf("%s %q: want an http(s) URL", flag, v)
		}
	}
	if err := s.listen.Validate(); err != nil {
		return err
	}
	if _, err := store.ParseURL(s.store); err != nil {
		return fmt.Errorf("--store: %v", err)
	}
	if s.hopTimeout <= 0 {
		return fmt.Errorf("--hop-timeout must be positive, got %s", s.hopTimeout)
	}
	if s.leaseTTL < time.Second {
		return fmt.Errorf("--lease-ttl must be at least 1s (renewals every third of it must fit store round trips), got %s", s.leaseTTL)
	}
	if s.drainTimeout <= 0 {
		return fmt.Errorf("--drain-timeout must be positive, got %s", s.drainTimeout)
	}
	if strings.TrimSpace(s.piiVault) == "" {
		return errors.New("--pii-vault must name a folder")
	}
	if s.healthInterval < 100*time.Millisecond {
		return fmt.Errorf("--health-interval must be at least 100ms, got %s", s.healthInterval)
	}
	return nil
}

func main() {
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, nil)))
	store.RouteRedisLogs(log)
	gctune.Start(service, log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], log, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}

// parse reads the settings from args and the environment; --help goes to out.
func parse(args []string, out io.Writer) (*settings, error) {
	var s settings
	return &s, config.Load(service, out, about, details, &s, args)
}

// run serves until ctx ends; ready, when set, is told the address listened on.
func run(ctx context.Context, args []string, log *slog.Logger, ready func(net.Addr)) error {
	s, err := parse(args, os.Stderr)
	if err != nil {
		return err
	}
	if log == nil {
		log = slog.Default()
	}

	var pls map[string]*pipeline.Pipeline
	if s.pipelines != "" {
		pls, err = pipeline.LoadDir(s.pipelines)
	} else {
		pls, err = stack.ShippedPipelines()
	}
	if err != nil {
		return fmt.Errorf("--pipelines: %w", err)
	}
	accs, err := identity.LoadAccounts(s.operatorsFile, s.operators)
	if err != nil {
		return fmt.Errorf("--operators: %w", err)
	}
	if s.operatorToken != "" {
		accs = append(accs, identity.TokenAccount(s.operatorToken))
	}
	ops, err := identity.NewOperators(log, accs...)
	if err != nil {
		return fmt.Errorf("operator credentials: %w", err)
	}
	creds, authz, err := s.security.Server(service, s.listen.Addr, identity.WithOperators(ops))
	if err != nil {
		return err
	}
	dc, err := s.security.Client(service)
	if err != nil {
		return err
	}
	st, err := store.OpenURLWait(ctx, s.store, s.storeWait, store.LogRetries(log, s.store))
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer st.Close()
	tp, err := telemetry.NewTracerProvider(ctx, service)
	if err != nil {
		return err
	}
	defer tp.Shutdown(context.Background())
	dc.TracerProvider = tp
	val, err := contract.NewValidator()
	if err != nil {
		return err
	}
	vault, err := stack.OpenPIIVault(pls, s.piiVault, defaultPIIVault)
	if err != nil {
		return fmt.Errorf("--pii-vault: %w", err)
	}
	dial := func(addr string) (grpc.ClientConnInterface, error) { return rpc.Dial(addr, dc) }
	rc, err := rpc.Dial(s.runner, dc)
	if err != nil {
		return fmt.Errorf("--agentrunner: %w", err)
	}
	defer rc.Close()
	wc, err := rpc.Dial(s.writeback, dc)
	if err != nil {
		return fmt.Errorf("--writeback: %w", err)
	}
	defer wc.Close()
	srv, err := coordinator.New(coordinator.Options{
		Store: st, Pipelines: pls, Validator: val, Logger: log, HopTimeout: s.hopTimeout, Dial: dial, TracerProvider: tp,
		RetryFor: s.hopRetryFor, LeaseTTL: s.leaseTTL, DrainTimeout: s.drainTimeout,
		EscalationWebhook: s.escalationWebhook, DeskURL: s.deskURL, PIIVault: vault,
		Runner:    handoffv1.NewAgentRunnerServiceClient(rc),
		Writeback: handoffv1.NewWritebackServiceClient(wc),
	})
	if err != nil {
		return err
	}
	reg := telemetry.NewRegistry()
	reg.MustRegister(srv.QueueCollector())
	// Health follows the store: without it no run can be created or advanced. A stop
	// drains: health says NOT_SERVING first so load balancers stop sending; the drivers
	// finish the hop in flight (up to --drain-timeout), save it and release their run
	// leases, so another replica takes the runs over at once (runs stay RUNNING); then
	// in-flight calls finish (watches end with Unavailable, to be resumed on another replica).
	g, err := server.New(srv.Service(),
		server.WithSecurity(creds, authz), server.WithLogger(log), server.WithTracerProvider(tp),
		server.WithMetrics(reg), server.WithHealthFrom(st, s.healthInterval),
		server.WithDrain(func() {
			log.Info("coordinator stopping: draining hops in flight", "drain_timeout", s.drainTimeout.String())
			srv.Close()
		}))
	if err != nil {
		return err
	}

	lis, m, err := s.listen.Open(reg, log)
	if err != nil {
		return err
	}
	defer m.Close()
	// Resume takes the RUNNING runs whose lease is free (left by a replica that died or
	// drained) and keeps scanning for such runs every --lease-ttl/2. A failed first scan is
	// not fatal: the store may be down for a moment, and the next scan picks the runs up.
	if n, err := srv.Resume(ctx); err != nil {
		log.Warn("resume runs: first scan failed; the takeover scan tries again", "err", err)
	} else if n > 0 {
		log.Info("resumed runs left in flight", "runs", n)
	}
	log.Info("coordinator listening", "addr", lis.Addr().String(), "pipelines", len(pls), "owner", srv.Owner(), "lease_ttl", s.leaseTTL.String())
	if ready != nil {
		ready(lis.Addr())
	}
	return g.Run(ctx, lis)
}
