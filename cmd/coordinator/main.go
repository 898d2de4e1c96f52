// Command coordinator runs the rail: the CoordinatorService over gRPC, driving each job's
// stages by calling an agent runner and the writeback service.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/coordinator"
)

type settings struct {
	listen, storePath, runner, writeback, pipelines string
	hopTimeout                                      time.Duration
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(os.Args[1:], log); err != nil {
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}

func run(args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	var s settings
	b := config.New(fs)
	b.String(&s.listen, "listen", "HANDOFF_COORDINATOR_LISTEN", stack.DefaultCoordinatorAddr, "gRPC listen address")
	b.String(&s.storePath, "store", "HANDOFF_STORE", "handoff-data/coordinator.db", "embedded store file")
	b.String(&s.runner, "agentrunner", "HANDOFF_AGENTRUNNER_ADDR", stack.DefaultRunnerAddr, "default agent runner address")
	b.String(&s.writeback, "writeback", "HANDOFF_WRITEBACK_ADDR", stack.DefaultWritebackAddr, "writeback service address")
	b.String(&s.pipelines, "pipelines", "HANDOFF_PIPELINES", "", "folder of pipeline YAML files (default: the shipped pipelines)")
	b.Duration(&s.hopTimeout, "hop-timeout", "HANDOFF_HOP_TIMEOUT", 2*time.Minute, "bound on one hop (ack and stage result)")
	if err := b.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}

	var pls map[string]*pipeline.Pipeline
	var err error
	if s.pipelines != "" {
		pls, err = pipeline.LoadDir(s.pipelines)
	} else {
		pls, err = stack.ShippedPipelines()
	}
	if err != nil {
		return fmt.Errorf("--pipelines: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.storePath), 0o755); err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	st, err := store.Open(s.storePath)
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer st.Close()
	val, err := contract.NewValidator()
	if err != nil {
		return err
	}
	dial := func(addr string) (grpc.ClientConnInterface, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	rc, err := dial(s.runner)
	if err != nil {
		return fmt.Errorf("--agentrunner: %w", err)
	}
	wc, err := dial(s.writeback)
	if err != nil {
		return fmt.Errorf("--writeback: %w", err)
	}
	srv, err := coordinator.New(coordinator.Options{
		Store: st, Pipelines: pls, Validator: val, Logger: log, HopTimeout: s.hopTimeout, Dial: dial,
		Runner:    handoffv1.NewAgentRunnerServiceClient(rc),
		Writeback: handoffv1.NewWritebackServiceClient(wc),
	})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", s.listen, err)
	}
	g := grpc.NewServer()
	coordinator.Register(g, srv)
	hs := health.NewServer()
	hs.SetServingStatus(handoffv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if n, err := srv.Resume(ctx); err != nil {
		return fmt.Errorf("resume runs: %w", err)
	} else if n > 0 {
		log.Info("resumed runs left in flight", "runs", n)
	}
	go func() {
		<-ctx.Done()
		hs.Shutdown()
		srv.Close()
		g.GracefulStop()
	}()
	log.Info("coordinator listening", "addr", lis.Addr().String(), "pipelines", len(pls))
	return g.Serve(lis)
}
