// Command writeback runs the WritebackService: the only writer to external systems. It writes
// to the demo ledger in its store and, when --webhook-url is set, to a webhook.
//
// The server is writeback.NewGRPCServer: the platform's interceptor chain (metrics, logging,
// identity, trace) with the writeback's enforcement (validate, gate, idempotency) as its step
// 6. Transport security is rpc.Security: --certs DIR (mTLS) or --plaintext-loopback (loopback
// only; callers' service tokens are checked with the public keys in --token-public-keys);
// one of them is required, and by the platform's policy only the coordinator may call Write.
//
// --store is a bbolt file, or redis://[:password@]host:port[/db][?prefix=P] so that several
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
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	hconfig "github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/writeback"
)

// service is the writeback's name in logs, metrics, traces and its certificate.
const service = "writeback"

// config is the parsed command line.
type config struct {
	listen         string
	storePath      string // --store as given, checked by store.ParseURL
	artifacts      string
	webhookURL     string
	webhookName    string
	webhookTimeout time.Duration
	pendingTTL     time.Duration
	receiptTTL     time.Duration
	storeWait      time.Duration
	metricsListen  string // "" = no metrics endpoint
	security       rpc.Security
}

// transport is what rpc.Security resolved: the server's credentials and identity check.
type transport struct {
	creds  credentials.TransportCredentials
	unary  grpc.UnaryServerInterceptor
	stream grpc.StreamServerInterceptor
}

// stopGrace bounds a graceful stop; calls still running after it are cut.
const stopGrace = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "writeback: %v\n", err)
		return 2
	}
	creds, unary, stream, err := cfg.security.Server(service, cfg.listen)
	if err != nil {
		fmt.Fprintf(stderr, "writeback: %v\n", err)
		return 2
	}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, nil)))
	store.RouteRedisLogs(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, transport{creds, unary, stream}, log, nil); err != nil {
		log.Error("writeback stopped", "service", service, "error", err)
		return 1
	}
	return 0
}

// parseConfig reads flags with environment fallbacks and checks every value. The security
// flags (--certs, --token-key-file, --token-public-keys, --plaintext-loopback) are rpc.Security's, read through
// internal/config.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (config, error) {
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("writeback", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		cfg            config
		webhookTimeout string
		pendingTTL     string
		receiptTTL     string
		storeWait      string
	)
	fs.StringVar(&cfg.listen, "listen", env("HANDOFF_WRITEBACK_LISTEN", "127.0.0.1:50053"), "gRPC listen address host:port (env HANDOFF_WRITEBACK_LISTEN)")
	fs.StringVar(&cfg.storePath, "store", env("HANDOFF_STORE", "./handoff-data/writeback.db"), "receipts and the demo ledger: a bbolt file, or redis://[:password@]host:port[/db][?prefix=P] to share them between processes (env HANDOFF_STORE)")
	fs.StringVar(&cfg.artifacts, "artifacts", env("HANDOFF_ARTIFACTS", "./handoff-data/artifacts"), "artifact folder (env HANDOFF_ARTIFACTS)")
	fs.StringVar(&cfg.webhookURL, "webhook-url", env("HANDOFF_WEBHOOK_URL", ""), "when set, also serve a webhook target POSTing to this http(s) URL (env HANDOFF_WEBHOOK_URL)")
	fs.StringVar(&cfg.webhookName, "webhook-name", env("HANDOFF_WEBHOOK_NAME", writeback.WebhookName), "target name of the webhook (env HANDOFF_WEBHOOK_NAME)")
	fs.StringVar(&webhookTimeout, "webhook-timeout", env("HANDOFF_WEBHOOK_TIMEOUT", writeback.DefaultWebhookTimeout.String()), "timeout of one webhook POST (env HANDOFF_WEBHOOK_TIMEOUT)")
	fs.StringVar(&pendingTTL, "pending-ttl", env("HANDOFF_WRITEBACK_PENDING_TTL", writeback.DefaultPendingTTL.String()), "how long an in-flight write blocks other callers of its key (env HANDOFF_WRITEBACK_PENDING_TTL)")
	fs.StringVar(&receiptTTL, "receipt-ttl", env("HANDOFF_WRITEBACK_RECEIPT_TTL", "0"), "how long receipts are kept, 0 = forever; a repeat after expiry writes again (env HANDOFF_WRITEBACK_RECEIPT_TTL)")
	fs.StringVar(&storeWait, "store-wait", env("HANDOFF_STORE_WAIT", "60s"), "at start-up, how long to keep trying a Redis store that does not answer yet, 0 = fail at once (env HANDOFF_STORE_WAIT)")
	fs.StringVar(&cfg.metricsListen, "metrics-listen", env("HANDOFF_METRICS_LISTEN", ""), "serve Prometheus metrics on http://host:port/metrics; empty = off (env HANDOFF_METRICS_LISTEN)")
	b := hconfig.New(fs)
	cfg.security.Bind(b)
	if err := b.Parse(args); err != nil {
		return config{}, err
	}

	if err := checkHostPort(cfg.listen); err != nil {
		return config{}, fmt.Errorf("--listen %q: %v", cfg.listen, err)
	}
	if cfg.metricsListen != "" {
		if err := checkHostPort(cfg.metricsListen); err != nil {
			return config{}, fmt.Errorf("--metrics-listen %q: %v", cfg.metricsListen, err)
		}
	}
	if cfg.storePath == "" {
		return config{}, errors.New("--store: must not be empty")
	}
	if _, err := store.ParseURL(cfg.storePath); err != nil {
		return config{}, fmt.Errorf("--store: %v", err)
	}
	if cfg.artifacts == "" {
		return config{}, errors.New("--artifacts: must not be empty")
	}
	durations := []struct {
		flag string
		raw  string
		dst  *time.Duration
		min  time.Duration
	}{
		{"--webhook-timeout", webhookTimeout, &cfg.webhookTimeout, time.Millisecond},
		{"--pending-ttl", pendingTTL, &cfg.pendingTTL, time.Second},
		{"--receipt-ttl", receiptTTL, &cfg.receiptTTL, 0},
		{"--store-wait", storeWait, &cfg.storeWait, 0},
	}
	for _, d := range durations {
		v, err := time.ParseDuration(d.raw)
		if err != nil {
			return config{}, fmt.Errorf("%s %q: not a duration (e.g. 30s, 2m, 720h)", d.flag, d.raw)
		}
		if v < d.min {
			return config{}, fmt.Errorf("%s %s: must be at least %s", d.flag, v, d.min)
		}
		*d.dst = v
	}
	if cfg.webhookURL != "" {
		if _, err := writeback.NewWebhook(writeback.WebhookConfig{Name: cfg.webhookName, URL: cfg.webhookURL, Timeout: cfg.webhookTimeout}); err != nil {
			return config{}, fmt.Errorf("--webhook-url/--webhook-name: %v", err)
		}
		// A claim must outlive the write it guards (writes run under PendingTTL/2).
		if cfg.webhookTimeout >= cfg.pendingTTL/2 {
			return config{}, fmt.Errorf("--webhook-timeout %s: must be under half of --pending-ttl (%s)", cfg.webhookTimeout, cfg.pendingTTL)
		}
	}
	return cfg, nil
}

// checkHostPort checks a listen address host:port (the host may be empty).
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// serve runs the service until ctx ends. ready, when set, is called with the bound gRPC and
// metrics addresses (metrics nil when off) once both accept connections.
func serve(ctx context.Context, cfg config, tr transport, base *slog.Logger, ready func(grpcAddr, metricsAddr net.Addr)) error {
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

	rcfg := rpc.ServerConfig{
		Service:        service,
		Logger:         base, // the chain adds service=writeback itself
		TracerProvider: tp,
		IdentityUnary:  tr.unary,
		IdentityStream: tr.stream,
		Creds:          tr.creds,
	}
	var metrics *http.Server
	var metricsLis net.Listener
	if cfg.metricsListen != "" {
		reg := telemetry.NewRegistry()
		rcfg.Metrics = telemetry.NewMetrics(reg, service)
		if metricsLis, err = net.Listen("tcp", cfg.metricsListen); err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", telemetry.Handler(reg))
		metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	gs, hs := writeback.NewGRPCServer(srv, rcfg)

	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		if metricsLis != nil {
			metricsLis.Close()
		}
		return fmt.Errorf("--listen: %w", err)
	}
	// The store is the service's one dependency: health follows it.
	go rpc.WatchStoreHealth(ctx, st, hs, []string{"", handoffv1.WritebackService_ServiceDesc.ServiceName}, time.Second, log)

	served := make(chan error, 2)
	go func() { served <- gs.Serve(lis) }()
	var metricsAddr net.Addr
	if metrics != nil {
		metricsAddr = metricsLis.Addr()
		go func() {
			if err := metrics.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				served <- fmt.Errorf("metrics: %w", err)
			}
		}()
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

	var serveErr error
	select {
	case err := <-served:
		serveErr = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		log.Info("writeback stopping")
	}
	hs.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopGrace):
		log.Warn("graceful stop timed out; cutting remaining calls")
		gs.Stop()
	}
	if metrics != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		metrics.Shutdown(sctx)
		cancel()
	}
	return serveErr
}
