// Command writeback runs the WritebackService: the only writer to external systems. It writes
// to the demo ledger in its store and, when --webhook-url is set, to a webhook.
//
// The server is assembled by internal/server: the platform's interceptor chain (metrics,
// logging, identity, trace) with the writeback's enforcement (validate, gate, idempotency) as
// its step 6. Transport security is rpc.Security: --certs DIR (mTLS) or --plaintext-loopback (loopback
// only; callers' service tokens are checked with the public keys in --token-public-keys);
// one of them is required, and by the platform's policy only the coordinator may call Write.
//
// --store is a bbolt file, or redis://[:password@]host:port[/db][?prefix=P] (or
// redis-cluster://[:password@]host:port,host:port,...[?prefix=P]) so that several
// writeback processes share one set of receipts (keys under "handoff:" unless ?prefix= names
// another; store.OpenURL reads it, as for every service). Tracing exports over OTLP when
// OTEL_EXPORTER_OTLP_ENDPOINT is set; Prometheus metrics are served on /metrics at
// --metrics-listen when it is set.
//
// Every flag falls back to an environment variable; a bad value stops it at start, naming the
// flag. Server reflection and grpc.health.v1 are on. SIGINT/SIGTERM stop it gracefully: calls
// in flight finish (and store their receipts) before the store is closed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/gctune"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/writeback"
)

// service is the writeback's name in logs, metrics, traces and its certificate.
const service = "writeback"

const (
	about   = "the only writer to external systems: writes a stage's artifact once the judge passed it, once per job, stage and artifact type"
	details = `Writes to the demo ledger in its store and, with --webhook-url, to a webhook. Only the
coordinator may call Write. Needs transport security (--certs DIR, or --plaintext-loopback on a
loopback --listen address). SIGINT/SIGTERM stop it gracefully: calls in flight finish (and
store their receipts) before the store is closed.`
)

// Defaults of the writeback's own settings.
const (
	defaultStore = "./handoff-data/writeback.db"
	// stopGrace bounds a graceful stop; calls still running after it are cut.
	stopGrace = server.DefaultStopTimeout
)

// settings are the writeback's configuration, from flags with HANDOFF_* fallbacks.
type settings struct {
	listen         server.Listen
	storePath      string // --store as given, checked by store.ParseURL
	artifacts      string
	webhookURL     string
	webhookName    string
	webhookTimeout time.Duration
	pendingTTL     time.Duration
	receiptTTL     time.Duration
	storeWait      time.Duration
	security       rpc.Security
}

// Bind registers every setting with its variable and default.
func (s *settings) Bind(b *config.Binder) {
	s.listen.Bind(b, "HANDOFF_WRITEBACK_LISTEN", server.WritebackAddr)
	b.String(&s.storePath, "store", "HANDOFF_STORE", defaultStore, "receipts and the demo ledger: a bbolt file, or redis://[:password@]host:port[/db][?prefix=P] or redis-cluster://host:port,host:port,...[?prefix=P] to share them between processes")
	b.String(&s.artifacts, "artifacts", "HANDOFF_ARTIFACTS", server.Artifacts, "artifact folder")
	b.String(&s.webhookURL, "webhook-url", "HANDOFF_WEBHOOK_URL", "", "when set, also serve a webhook target POSTing to this http(s) URL")
	b.String(&s.webhookName, "webhook-name", "HANDOFF_WEBHOOK_NAME", writeback.WebhookName, "target name of the webhook")
	b.Duration(&s.webhookTimeout, "webhook-timeout", "HANDOFF_WEBHOOK_TIMEOUT", writeback.DefaultWebhookTimeout, "timeout of one webhook POST")
	b.Duration(&s.pendingTTL, "pending-ttl", "HANDOFF_WRITEBACK_PENDING_TTL", writeback.DefaultPendingTTL, "how long an in-flight write blocks other callers of its key")
	b.Duration(&s.receiptTTL, "receipt-ttl", "HANDOFF_WRITEBACK_RECEIPT_TTL", 0, "how long receipts are kept, 0 = forever; a repeat after expiry writes again")
	b.Duration(&s.storeWait, "store-wait", "HANDOFF_STORE_WAIT", server.DefaultStoreWait, "at start-up, how long to keep trying a Redis store that does not answer yet, 0 = fail at once")
	s.security.Bind(b)
}

// Validate checks the values, naming the flag of a bad one.
func (s *settings) Validate() error {
	if err := s.listen.Validate(); err != nil {
		return err
	}
	if s.storePath == "" {
		return errors.New("--store: must not be empty")
	}
	if _, err := store.ParseURL(s.storePath); err != nil {
		return fmt.Errorf("--store: %v", err)
	}
	if s.artifacts == "" {
		return errors.New("--artifacts: must not be empty")
	}
	if s.webhookTimeout < time.Millisecond {
		return fmt.Errorf("--webhook-timeout %s: must be at least 1ms", s.webhookTimeout)
	}
	if s.pendingTTL < time.Second {
		return fmt.Errorf("--pending-ttl %s: must be at least 1s", s.pendingTTL)
	}
	if s.webhookURL != "" {
		if _, err := writeback.NewWebhook(writeback.WebhookConfig{Name: s.webhookName, URL: s.webhookURL, Timeout: s.webhookTimeout}); err != nil {
			return fmt.Errorf("--webhook-url/--webhook-name: %v", err)
		}
		// A claim must outlive the write it guards (writes run under PendingTTL/2).
		if s.webhookTimeout >= s.pendingTTL/2 {
			return fmt.Errorf("--webhook-timeout %s: must be under half of --pending-ttl (%s)", s.webhookTimeout, s.pendingTTL)
		}
	}
	return nil
}

// transport is what rpc.Security resolved: the server's credentials and identity check.
type transport struct {
	creds credentials.TransportCredentials
	authz *identity.Authorizer
}

func main() {
	gctune.Start(service, slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, nil))))
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "writeback: %v\n", err)
		return 2
	}
	creds, authz, err := cfg.security.Server(service, cfg.listen.Addr)
	if err != nil {
		fmt.Fprintf(stderr, "writeback: %v\n", err)
		return 2
	}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, nil)))
	store.RouteRedisLogs(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, transport{creds, authz}, log, nil); err != nil {
		log.Error("writeback stopped", "service", service, "error", err)
		return 1
	}
	return 0
}

// parse reads the settings from args and the environment and checks every value; --help
// and flag errors go to out.
func parse(args []string, out io.Writer) (settings, error) {
	var s settings
	err := config.Load(service, out, about, details, &s, args)
	return s, err
}

// serve runs the service until ctx ends. ready, when set, is called with the bound gRPC and
// metrics addresses (metrics nil when off) once both accept connections.
func serve(ctx context.Context, cfg settings, tr transport, base *slog.Logger, ready func(grpcAddr, metricsAddr net.Addr)) error {
	log := base.With("service", service)

	tp, err := telemetry.NewTracerProvider(ctx, service)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracer shutdown", "error", err)
		}
	}()

	st, err := store.OpenURLWait(ctx, cfg.storePath, cfg.storeWait, store.LogRetries(log, cfg.storePath))
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer st.Close()
	files, err := artifact.NewFiles(cfg.artifacts)
	if err != nil {
		return fmt.Errorf("--artifacts: %w", err)
	}
	v, err := contract.NewValidator(contract.V1)
	if err != nil {
		return err
	}
	targets := []writeback.Target{writeback.NewLedger(st)}
	if cfg.webhookURL != "" {
		wh, err := writeback.NewWebhook(writeback.WebhookConfig{Name: cfg.webhookName, URL: cfg.webhookURL, Timeout: cfg.webhookTimeout})
		if err != nil {
			return fmt.Errorf("--webhook-url: %w", err)
		}
		targets = append(targets, wh)
	}
	srv, err := writeback.New(writeback.Options{
		Validator:  v,
		Store:      st,
		Artifacts:  files,
		Targets:    targets,
		PendingTTL: cfg.pendingTTL,
		ReceiptTTL: cfg.receiptTTL,
		Logger:     log,
	})
	if err != nil {
		return err
	}

	reg := telemetry.NewRegistry()
	// The store is the service's one dependency: health follows it.
	gs, err := server.New(srv.Service(),
		server.WithSecurity(tr.creds, tr.authz), server.WithLogger(base), // the server adds service=writeback itself
		server.WithTracerProvider(tp), server.WithMetrics(reg),
		server.WithHealthFrom(st, server.DefaultHealthInterval), server.WithStopTimeout(stopGrace))
	if err != nil {
		return err
	}
	lis, m, err := cfg.listen.Open(reg, log)
	if err != nil {
		return err
	}
	defer m.Close()
	var metricsAddr net.Addr
	if m != nil {
		metricsAddr = m.Addr()
	}
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name()
	}
	security := "mtls"
	if tr.creds == nil {
		security = "plaintext-loopback"
	}
	attrs := []any{"addr", lis.Addr().String(), "security", security, "store", store.Redact(cfg.storePath),
		"artifacts", files.Root(), "targets", names, "pending_ttl", cfg.pendingTTL.String(), "receipt_ttl", cfg.receiptTTL.String()}
	if metricsAddr != nil {
		attrs = append(attrs, "metrics", "http://"+metricsAddr.String()+"/metrics")
	}
	log.Info("writeback listening", attrs...)
	if ready != nil {
		ready(lis.Addr(), metricsAddr)
	}
	if err := gs.Run(ctx, lis); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("writeback stopped")
	return nil
}
