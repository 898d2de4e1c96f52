// Package stack runs the whole platform in one process: coordinator, agent runner and
// writeback, each on its own gRPC listener on loopback, talking to each other over real
// gRPC, all on one embedded store. It is what `handoff up`, `handoff demo` and the
// end-to-end tests start; production runs the three services as separate binaries.
package stack

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/pipelines"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
	"github.com/handoffhq/handoff/services/coordinator"
	"github.com/handoffhq/handoff/services/coordinator/web"
	"github.com/handoffhq/handoff/services/writeback"
)

// Config says where the stack listens and keeps its data. Zero values are filled in by
// Start: the shipped pipelines and support agents, the default ports.
type Config struct {
	// DataDir holds the store file (handoff.db) and the artifacts folder.
	DataDir string
	// Listen addresses; "127.0.0.1:0" picks a free port.
	CoordinatorAddr, RunnerAddr, WritebackAddr string
	Pipelines                                  map[string]*pipeline.Pipeline
	Agents                                     []agentrunner.Agent
	// V2Agents names the runner's agents that also read handoff.v2 (a rolling upgrade, one
	// stage at a time); the others declare handoff.v1 only. The coordinator sends each
	// stage the newest version its agent declares (Describe).
	V2Agents []string
	// DescribeTTL is how long the coordinator trusts a runner's declared versions
	// (coordinator.Options.DescribeTTL; default 5s).
	DescribeTTL time.Duration
	// WebhookURL, when set, adds the "webhook" writeback target.
	WebhookURL string
	// EscalationWebhook is POSTed each escalation of a pipeline that names no
	// escalation.webhook of its own.
	EscalationWebhook string
	Logger            *slog.Logger
	// Tamper is passed to the coordinator: fault injection for tests only.
	Tamper func(*handoffv1.HandoffPackage)
	// GenAISpans turns on the agent runner's OpenTelemetry GenAI spans
	// (agentrunner.Options.GenAISpans).
	GenAISpans bool
	// WrapRunner, when set, wraps the coordinator's client of the agent runner: fault
	// injection for tests only (a runner that answers what this one never would).
	WrapRunner func(handoffv1.AgentRunnerServiceClient) handoffv1.AgentRunnerServiceClient
	// Store, when set, is used instead of the embedded store in DataDir (for example a
	// Redis store); the caller keeps it and closes it after the stack.
	Store store.Store
	// TracerProvider for every service's spans; default: an SDK provider that makes ids
	// and exports over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
	TracerProvider oteltrace.TracerProvider
	// WebAddr, when set, serves the operator page (escalations) over HTTP on this address,
	// meant for loopback ("127.0.0.1:8080"); empty: off.
	WebAddr string
	// OperatorToken, when set, is an operator's credential (authorization: Bearer <token>,
	// and the web page's sign-in). Without it only callers holding an operator service
	// identity (DialAs(addr, "operator")) can reach ListEscalations and ResolveEscalation,
	// and the web page does not start.
	OperatorToken string
	// Operators are more operator accounts (named people with a role, their tokens as
	// hashes), beside the OperatorToken's account "operator" (a resolver).
	Operators []identity.Account
	// PIIVault is the folder of the coordinator's personal-data vault, opened only when a
	// pipeline has pii.policy redact; default DataDir/pii-vault.
	PIIVault string
	// HealthInterval is how often each service's health pings the store, as in the
	// binaries (default server.DefaultHealthInterval): NOT_SERVING while the ping fails.
	HealthInterval time.Duration
	// RunnerDial and WritebackDial, when set, are the addresses the coordinator dials for
	// the agent runner and the writeback instead of the stack's own listeners: for tests
	// only, which put a proxy between them (`handoff chaos --store bbolt` puts its hop
	// proxy there, forwarding to RunnerAddr and WritebackAddr).
	RunnerDial, WritebackDial string
}

// Default listen addresses of `handoff up`: the binaries' defaults.
const (
	DefaultCoordinatorAddr = server.CoordinatorAddr
	DefaultRunnerAddr      = server.RunnerAddr
	DefaultWritebackAddr   = server.WritebackAddr
)

// stopTimeout bounds each server's graceful stop in Close.
const stopTimeout = 10 * time.Second

// Stack is a running platform.
type Stack struct {
	Store       store.Store
	ownStore    bool
	Artifacts   *artifact.Files
	Runner      *agentrunner.Server
	Coordinator *coordinator.Server
	// Addresses actually listened on.
	CoordinatorAddr, RunnerAddr, WritebackAddr string
	// WebAddr is the operator page's address, when Config.WebAddr was set.
	WebAddr string

	// Registry holds the three services' metrics (label service=...); serve it with
	// telemetry.Handler.
	Registry *prometheus.Registry

	signers  map[string]*identity.Signer // one key per identity; the verifiers get public keys only
	tp       oteltrace.TracerProvider
	shutdown func(context.Context) error
	log      *slog.Logger
	health   time.Duration
	servers  []*server.Server // in start order: callees before their callers
	conns    []*grpc.ClientConn
	web      *http.Server
}

// ShippedPipelines loads the pipelines compiled into the binary.
func ShippedPipelines() (map[string]*pipeline.Pipeline, error) {
	return pipeline.LoadAll(pipelines.FS)
}

// Start opens the store, starts the three services and resumes any run left in flight.
func Start(ctx context.Context, cfg Config) (st *Stack, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("stack: DataDir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Pipelines == nil {
		if cfg.Pipelines, err = ShippedPipelines(); err != nil {
			return nil, fmt.Errorf("stack: load shipped pipelines: %w", err)
		}
	}
	if cfg.Agents == nil {
		cfg.Agents = support.Agents()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("stack: data dir: %w", err)
	}
	s := &Stack{Registry: telemetry.NewRegistry(), tp: cfg.TracerProvider, log: cfg.Logger, health: cfg.HealthInterval}
	// One process, plaintext on loopback: the services prove who they are to each other
	// with tokens, each signed with that service's own key, made here and never written
	// anywhere. Each server's verifier holds only the public keys, so a service's code
	// could not mint another's identity even in this process.
	s.signers = map[string]*identity.Signer{}
	for _, svc := range Identities {
		if s.signers[svc], err = identity.GenerateSigner(svc); err != nil {
			return nil, err
		}
	}
	if s.tp == nil {
		tp, err := telemetry.NewTracerProvider(ctx, "handoff")
		if err != nil {
			return nil, err
		}
		s.tp, s.shutdown = tp, tp.Shutdown
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.Store = cfg.Store; s.Store == nil {
		if s.Store, err = store.Open(filepath.Join(cfg.DataDir, "handoff.db")); err != nil {
			return nil, err
		}
		s.ownStore = true
	}
	if s.Artifacts, err = artifact.NewFiles(filepath.Join(cfg.DataDir, "artifacts")); err != nil {
		return nil, err
	}
	val, err := contract.NewValidator()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger

	// Listen first, so a taken port fails before anything runs.
	lis := map[string]net.Listener{}
	for name, addr := range map[string]string{"coordinator": or(cfg.CoordinatorAddr, DefaultCoordinatorAddr), "agent runner": or(cfg.RunnerAddr, DefaultRunnerAddr), "writeback": or(cfg.WritebackAddr, DefaultWritebackAddr)} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lis {
				l.Close()
			}
			return nil, fmt.Errorf("stack: %s cannot listen on %s: %w", name, addr, err)
		}
		lis[name] = l
	}
	s.CoordinatorAddr, s.RunnerAddr, s.WritebackAddr = lis["coordinator"].Addr().String(), lis["agent runner"].Addr().String(), lis["writeback"].Addr().String()
	var wl net.Listener
	if cfg.WebAddr != "" {
		if wl, err = net.Listen("tcp", cfg.WebAddr); err != nil {
			for _, l := range lis {
				l.Close()
			}
			return nil, fmt.Errorf("stack: operator page cannot listen on %s: %w", cfg.WebAddr, err)
		}
		s.WebAddr = wl.Addr().String()
		defer func() {
			if s.web == nil {
				wl.Close() // Start failed before the page served it
			}
		}()
	}

	agents, err := upgraded(cfg.Agents, cfg.V2Agents)
	if err != nil {
		return nil, err
	}
	v1, err := contract.NewValidator(contract.V1)
	if err != nil {
		return nil, err
	}
	s.Runner, err = agentrunner.New(agentrunner.Options{Validator: v1, Store: s.Store, Artifacts: s.Artifacts, Agents: agents, Logger: log.With("service", "agentrunner"), GenAISpans: cfg.GenAISpans})
	if err != nil {
		return nil, err
	}
	if _, err := s.serve(lis["agent runner"], s.Runner.Service(), nil); err != nil {
		return nil, err
	}

	// The demo ledger enforces the key as a downstream system must (it upserts), and on
	// the writeback's own store each entry and its receipt are one transaction. A write
	// the platform let through twice still shows, in the entry's Offers.
	targets := []writeback.Target{writeback.NewLedger(s.Store)}
	if cfg.WebhookURL != "" {
		wh, err := writeback.NewWebhook(writeback.WebhookConfig{URL: cfg.WebhookURL})
		if err != nil {
			return nil, err
		}
		targets = append(targets, wh)
	}
	wb, err := writeback.New(writeback.Options{Validator: val, Store: s.Store, Artifacts: s.Artifacts, Targets: targets, Logger: log.With("service", "writeback")})
	if err != nil {
		return nil, err
	}
	if _, err := s.serve(lis["writeback"], wb.Service(), nil); err != nil {
		return nil, err
	}

	runnerConn, err := s.DialAs(or(cfg.RunnerDial, s.RunnerAddr), "coordinator")
	if err != nil {
		return nil, err
	}
	wbConn, err := s.DialAs(or(cfg.WritebackDial, s.WritebackAddr), "coordinator")
	if err != nil {
		return nil, err
	}
	runnerClient := handoffv1.NewAgentRunnerServiceClient(runnerConn)
	if cfg.WrapRunner != nil {
		runnerClient = cfg.WrapRunner(runnerClient)
	}
	vault, err := OpenPIIVault(cfg.Pipelines, cfg.PIIVault, filepath.Join(cfg.DataDir, "pii-vault"))
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	s.Coordinator, err = coordinator.New(coordinator.Options{
		PIIVault: vault,
		Store:    s.Store, Pipelines: cfg.Pipelines, Validator: val, Logger: log.With("service", "coordinator"), DescribeTTL: cfg.DescribeTTL,
		Runner:         runnerClient,
		Writeback:      handoffv1.NewWritebackServiceClient(wbConn),
		Dial:           func(addr string) (grpc.ClientConnInterface, error) { return s.DialAs(addr, "coordinator") },
		Tamper:         cfg.Tamper,
		TracerProvider: s.tp,
		Artifacts:      s.Artifacts,
		// Escalations are POSTed to the pipeline's webhook, else this one, with a link to
		// the run's page when the page is served.
		EscalationWebhook: cfg.EscalationWebhook,
		DeskURL:           deskURL(s.WebAddr),
	})
	if err != nil {
		return nil, err
	}
	s.Registry.MustRegister(s.Coordinator.QueueCollector())
	coordOpts := []identity.Option{}
	if accs := slices.Clone(cfg.Operators); cfg.OperatorToken != "" || len(accs) > 0 {
		if cfg.OperatorToken != "" {
			accs = append(accs, identity.TokenAccount(cfg.OperatorToken))
		}
		ops, err := identity.NewOperators(log, accs...)
		if err != nil {
			return nil, fmt.Errorf("stack: operator token: %w", err)
		}
		coordOpts = append(coordOpts, identity.WithOperators(ops))
	}
	coordAuthz, err := s.serve(lis["coordinator"], s.Coordinator.Service(), coordOpts, server.WithDrain(s.Coordinator.Close))
	if err != nil {
		return nil, err
	}
	if cfg.WebAddr != "" {
		page, err := web.New(s.Coordinator, coordAuthz, web.Options{Logger: log.With("service", "web")})
		if err != nil {
			return nil, fmt.Errorf("stack: operator page: %w (set Config.OperatorToken)", err)
		}
		// Bounded reads and writes: a client trickling a request cannot hold a connection.
		s.web = &http.Server{Handler: page, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
			WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
		go s.web.Serve(wl)
	}
	if n, err := s.Coordinator.Resume(ctx); err != nil {
		return nil, fmt.Errorf("stack: resume runs: %w", err)
	} else if n > 0 {
		log.Info("resumed runs left in flight", "runs", n)
	}
	return s, nil
}

func deskURL(addr string) string {
	if addr == "" {
		return ""
	}
	return "http://" + addr
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// serve starts svc's server on l, assembled by internal/server as in the binaries: the
// chain with svc's enforcement, health following the store, reflection (so grpcurl can list
// and call it without proto files), metrics in s.Registry. extra are identity options
// beyond the platform's (operator credentials), more are server options beyond the
// stack's (the coordinator's drain). The server accepts tokens addressed to svc.Name,
// verified with the public keys of Identities. It returns the server's identity check, for
// in-process callers of its handlers.
func (s *Stack) serve(l net.Listener, svc server.Service, extra []identity.Option, more ...server.Option) (*identity.Authorizer, error) {
	pubs := map[string]ed25519.PublicKey{}
	for name, sg := range s.signers {
		pubs[name] = sg.PublicKey()
	}
	v, err := identity.NewVerifier(svc.Name, pubs)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("stack: %s: %w", svc.Name, err)
	}
	idOpts := append([]identity.Option{identity.WithVerifier(v), identity.WithPolicy(identity.DefaultPolicy()), identity.WithLogger(s.log)}, extra...)
	authz := identity.NewAuthorizer(idOpts...)
	opts := append([]server.Option{
		server.WithSecurity(nil, authz), // plaintext: the listeners are on loopback
		server.WithLogger(s.log), server.WithTracerProvider(s.tp), server.WithMetrics(s.Registry),
		server.WithHealthFrom(s.Store, s.health), server.WithStopTimeout(stopTimeout),
	}, more...)
	srv, err := server.New(svc, opts...)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("stack: %s: %w", svc.Name, err)
	}
	s.servers = append(s.servers, srv)
	go srv.Serve(l)
	return authz, nil
}

// Dial returns a client connection to one of the stack's addresses, calling without a
// service identity (as grpcurl or a client would): it may submit jobs and Check packages,
// not read jobs. Close closes it.
func (s *Stack) Dial(addr string) (*grpc.ClientConn, error) {
	return s.dial(addr, rpc.DialConfig{TracerProvider: s.tp})
}

// Identities are the services the stack holds a token key for: its three services, and the
// operator (for DialAs).
var Identities = []string{"coordinator", "agentrunner", "writeback", "operator"}

// DialAs returns a connection whose calls carry tokens from service (one of Identities),
// each addressed to the service it calls; "operator" is a person's identity (it may read
// jobs and resolve escalations).
func (s *Stack) DialAs(addr, service string) (*grpc.ClientConn, error) {
	sg, ok := s.signers[service]
	if !ok {
		return nil, fmt.Errorf("stack: DialAs %q: the stack holds keys for %v only", service, Identities)
	}
	return s.dial(addr, rpc.DialConfig{TracerProvider: s.tp, PerRPC: sg.PerRPCCredentials()})
}

func (s *Stack) dial(addr string, dc rpc.DialConfig) (*grpc.ClientConn, error) {
	cc, err := rpc.Dial(addr, dc)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, cc)
	return cc, nil
}

// Close drains the servers (health NOT_SERVING on all three first; in-flight calls finish,
// up to 10 s per server), stops the drivers and closes the store. Runs still RUNNING
// resume at the next Start on the same DataDir.
func (s *Stack) Close() {
	for _, srv := range s.servers {
		srv.Drain() // the coordinator's drain lets its drivers finish their hops
	}
	if s.web != nil {
		s.web.Close()
	}
	if s.Coordinator != nil {
		s.Coordinator.Close() // when Start failed before the coordinator's server
	}
	for i := len(s.servers) - 1; i >= 0; i-- { // callers first: a runner outlives the hops sent to it
		s.servers[i].GracefulStop()
	}
	for _, c := range s.conns {
		c.Close()
	}
	if s.Store != nil && s.ownStore {
		s.Store.Close()
	}
	if s.shutdown != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.shutdown(ctx) // flush spans to the OTLP exporter, when one is configured
	}
}

// upgraded returns agents with those named in v2 declaring handoff.v1 and handoff.v2; a
// name no agent has is an error.
func upgraded(agents []agentrunner.Agent, v2 []string) ([]agentrunner.Agent, error) {
	out := slices.Clone(agents)
	for _, n := range v2 {
		i := slices.IndexFunc(out, func(a agentrunner.Agent) bool { return a != nil && a.Card().Name == n })
		if i < 0 {
			return nil, fmt.Errorf("stack: V2Agents: no agent %q on the runner", n)
		}
		out[i] = agentrunner.Accepting(out[i], contract.V1, contract.V2)
	}
	return out, nil
}

// OpenPIIVault opens the personal-data vault in dir (def when dir is empty) when one of
// pipelines redacts (pii.policy redact), and returns nil otherwise: a folder for values
// nobody redacts is not made.
func OpenPIIVault(pipelines map[string]*pipeline.Pipeline, dir, def string) (pii.Keeper, error) {
	need := false
	for _, p := range pipelines {
		need = need || p.PIIPolicy() == pipeline.PIIRedact
	}
	if !need {
		return nil, nil
	}
	if dir == "" {
		dir = def
	}
	v, err := pii.OpenVault(dir)
	if err != nil {
		return nil, err
	}
	return v, nil
}
