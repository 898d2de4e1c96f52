package rpc

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Pinger is what WatchStoreHealth checks: store.Store's Ping.
type Pinger interface {
	Ping(ctx context.Context) error
}

// WatchStoreHealth makes hs follow the store until ctx ends: it pings st at once and then
// every interval (each ping bounded by the interval), and sets every name in services ("" is
// the server as a whole) SERVING while the ping succeeds and NOT_SERVING while it fails. A
// service whose store is unreachable can do none of its work (no run advances, no claim,
// no write), so a load
// balancer should send its callers elsewhere. Each change is logged once, naming the error.
// After hs.Shutdown its updates are ignored, so a draining server stays NOT_SERVING.
func WatchStoreHealth(ctx context.Context, st Pinger, hs *health.Server, services []string, interval time.Duration, log *slog.Logger) {
	if interval <= 0 {
		interval = time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	serving := true // what the server was started with
	check := func() {
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := st.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		ok := err == nil
		if ok == serving {
			return
		}
		serving = ok
		status := healthpb.HealthCheckResponse_SERVING
		if ok {
			log.Info("store reachable again; health SERVING")
		} else {
			status = healthpb.HealthCheckResponse_NOT_SERVING
			log.Error("store unreachable; health NOT_SERVING until it answers", "err", err)
		}
		for _, name := range services {
			hs.SetServingStatus(name, status)
		}
	}
	check()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			check()
		}
	}
}
