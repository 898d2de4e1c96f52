// Command writeback runs the WritebackService: the only writer to external systems. It writes
// to the demo ledger in its embedded store and, when --webhook-url is set, to a webhook.
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
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/writeback"
)

// config is the parsed command line.
type config struct {
	listen         string
	storePath      string
	artifacts      string
	webhookURL     string
	webhookName    string
	webhookTimeout time.Duration
	pendingTTL     time.Duration
	receiptTTL     time.Duration
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
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("service", "writeback")
	if err := serve(cfg, log); err != nil {
		log.Error("writeback stopped", "error", err)
		return 1
	}
	return 0
}

// parseConfig reads flags with environment fallbacks and checks every value.
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
	)
	fs.StringVar(&cfg.listen, "listen", env("HANDOFF_WRITEBACK_LISTEN", "127.0.0.1:50053"), "gRPC listen address host:port (env HANDOFF_WRITEBACK_LISTEN)")
	fs.StringVar(&cfg.storePath, "store", env("HANDOFF_STORE", "./handoff-data/writeback.db"), "bbolt file for receipts and the demo ledger (env HANDOFF_STORE)")
	fs.StringVar(&cfg.artifacts, "artifacts", env("HANDOFF_ARTIFACTS", "./handoff-data/artifacts"), "artifact folder (env HANDOFF_ARTIFACTS)")
	fs.StringVar(&cfg.webhookURL, "webhook-url", env("HANDOFF_WEBHOOK_URL", ""), "when set, also serve a webhook target POSTing to this http(s) URL (env HANDOFF_WEBHOOK_URL)")
	fs.StringVar(&cfg.webhookName, "webhook-name", env("HANDOFF_WEBHOOK_NAME", writeback.WebhookName), "target name of the webhook (env HANDOFF_WEBHOOK_NAME)")
	fs.StringVar(&webhookTimeout, "webhook-timeout", env("HANDOFF_WEBHOOK_TIMEOUT", writeback.DefaultWebhookTimeout.String()), "timeout of one webhook POST (env HANDOFF_WEBHOOK_TIMEOUT)")
	fs.StringVar(&pendingTTL, "pending-ttl", env("HANDOFF_WRITEBACK_PENDING_TTL", writeback.DefaultPendingTTL.String()), "how long an in-flight write blocks other callers of its key (env HANDOFF_WRITEBACK_PENDING_TTL)")
	fs.StringVar(&receiptTTL, "receipt-ttl", env("HANDOFF_WRITEBACK_RECEIPT_TTL", "0"), "how long receipts are kept, 0 = forever; a repeat after expiry writes again (env HANDOFF_WRITEBACK_RECEIPT_TTL)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	_, port, err := net.SplitHostPort(cfg.listen)
	if err != nil {
		return config{}, fmt.Errorf("--listen %q: %v", cfg.listen, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return config{}, fmt.Errorf("--listen %q: port %q is not a number from 0 to 65535", cfg.listen, port)
	}
	if cfg.storePath == "" {
		return config{}, errors.New("--store: must not be empty")
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

func serve(cfg config, log *slog.Logger) error {
	if err := os.MkdirAll(filepath.Dir(cfg.storePath), 0o755); err != nil {
		return fmt.Errorf("--store %s: %w", cfg.storePath, err)
	}
	st, err := store.Open(cfg.storePath)
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

	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	gs := grpc.NewServer()
	writeback.Register(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	service := handoffv1.WritebackService_ServiceDesc.ServiceName
	setHealth := func(ok bool) {
		s := healthpb.HealthCheckResponse_SERVING
		if !ok {
			s = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", s)
		hs.SetServingStatus(service, s)
	}
	setHealth(true)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The store is the service's one dependency: health follows it.
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := st.Ping(pctx)
				cancel()
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					log.Warn("store ping failed", "error", err)
				}
				setHealth(err == nil)
			}
		}
	}()

	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name()
	}
	log.Info("writeback listening", "addr", lis.Addr().String(), "store", cfg.storePath,
		"artifacts", files.Root(), "targets", names, "pending_ttl", cfg.pendingTTL.String(), "receipt_ttl", cfg.receiptTTL.String())

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("writeback stopping")
	hs.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopGrace):
		log.Warn("graceful stop timed out; cutting remaining calls")
		gs.Stop()
	}
	return nil
}
