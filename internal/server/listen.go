package server

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoffhq/handoff/internal/config"
)

// Listen is what every service binary listens on, as settings: its gRPC address (--listen)
// and, when set, its Prometheus endpoint (--metrics-listen).
type Listen struct {
	Addr    string
	Metrics string // "" = no metrics endpoint
}

// Bind registers --listen (variable env, default def) and --metrics-listen
// (HANDOFF_METRICS_LISTEN, off by default).
func (l *Listen) Bind(b *config.Binder, env, def string) {
	b.String(&l.Addr, "listen", env, def, "gRPC listen address host:port")
	b.String(&l.Metrics, "metrics-listen", "HANDOFF_METRICS_LISTEN", "", "serve Prometheus metrics at http://ADDR/metrics (empty: off)")
}

// Validate checks both addresses, naming the flag of a bad one.
func (l *Listen) Validate() error {
	if err := config.HostPort("listen", l.Addr); err != nil {
		return err
	}
	if l.Metrics != "" {
		return config.HostPort("metrics-listen", l.Metrics)
	}
	return nil
}

// Open listens on the gRPC address and starts the metrics endpoint for reg when one is set
// (m is nil otherwise; Close it when done). On error nothing is left open.
func (l *Listen) Open(reg *prometheus.Registry, log *slog.Logger) (lis net.Listener, m *Metrics, err error) {
	if lis, err = net.Listen("tcp", l.Addr); err != nil {
		return nil, nil, fmt.Errorf("--listen %s: %w", l.Addr, err)
	}
	if l.Metrics != "" {
		if m, err = ServeMetrics("metrics-listen", l.Metrics, reg, log); err != nil {
			lis.Close()
			return nil, nil, err
		}
	}
	return lis, m, nil
}
