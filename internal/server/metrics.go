package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoffhq/handoff/internal/telemetry"
)

// The metrics endpoint's timeouts, the same in every binary and in `handoff up`: a client
// that sends its headers slowly, or never reads the answer, or idles, does not keep a
// connection (the endpoint has no authentication, so it must not be held open for free).
const (
	MetricsReadHeaderTimeout = 5 * time.Second
	MetricsWriteTimeout      = 30 * time.Second
	MetricsIdleTimeout       = 2 * time.Minute
	metricsShutdown          = 5 * time.Second
)

// Metrics is a running /metrics endpoint.
type Metrics struct {
	srv *http.Server
	lis net.Listener
}

// NewMetricsServer returns the HTTP server of reg's /metrics, with the timeouts above.
func NewMetricsServer(reg *prometheus.Registry) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", telemetry.Handler(reg))
	return &http.Server{Handler: mux, ReadHeaderTimeout: MetricsReadHeaderTimeout, WriteTimeout: MetricsWriteTimeout, IdleTimeout: MetricsIdleTimeout}
}

// ServeMetrics listens on addr (of the flag named flag, for the error) and serves reg at
// /metrics until Close. A serving error after the start is logged.
func ServeMetrics(flag, addr string, reg *prometheus.Registry, log *slog.Logger) (*Metrics, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, addr, err)
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Metrics{srv: NewMetricsServer(reg), lis: lis}
	go func() {
		if err := m.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "addr", lis.Addr().String(), "err", err)
		}
	}()
	return m, nil
}

// Addr is the address listened on.
func (m *Metrics) Addr() net.Addr { return m.lis.Addr() }

// URL is the endpoint's http://host:port/metrics.
func (m *Metrics) URL() string { return "http://" + m.lis.Addr().String() + "/metrics" }

// Close lets scrapes in progress finish (for a few seconds) and stops. A nil m (no
// endpoint) does nothing.
func (m *Metrics) Close() error {
	if m == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), metricsShutdown)
	defer cancel()
	return m.srv.Shutdown(ctx)
}
