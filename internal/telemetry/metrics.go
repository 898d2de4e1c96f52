package telemetry

import (
	"context"
	"net/http"
	"strings"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/handoffhq/handoff/internal/interceptor/hop"
)

// Metrics are one service's Prometheus metrics: go-grpc-middleware's per-method RPC
// metrics (grpc_server_handled_total{grpc_method, grpc_code}, handling-time histogram) and
// handoff_acks_total{grpc_method, status}, one count per Ack the service answers with.
// Every series carries service="<name>", so several services can share one registry (as
// in `handoff up`).
type Metrics struct {
	RPC  *grpcprom.ServerMetrics
	Acks *prometheus.CounterVec
}

// NewRegistry returns a registry with the Go runtime and process collectors. A fresh
// registry per process (or per test) keeps registrations from colliding.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// NewMetrics registers service's metrics on reg.
func NewMetrics(reg prometheus.Registerer, service string) *Metrics {
	m := &Metrics{
		RPC: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram()),
		Acks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_acks_total",
			Help: "Acks sent, by gRPC method and ack status (ACCEPTED, REJECTED_SCHEMA, REJECTED_ROLE, REJECTED_BUDGET, DUPLICATE).",
		}, []string{"grpc_method", "status"}),
	}
	prometheus.WrapRegistererWith(prometheus.Labels{"service": service}, reg).MustRegister(m.RPC, m.Acks)
	return m
}

// Handler serves reg in the Prometheus text format (mount it at /metrics).
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

func (m *Metrics) count(fullMethod string, msg any) {
	if a := hop.FindAck(msg); a != nil { // the response itself, or its "ack" field
		method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
		m.Acks.WithLabelValues(method, strings.TrimPrefix(a.GetStatus().String(), "ACK_STATUS_")).Inc()
	}
}

// AckUnaryInterceptor counts the Ack in each unary response.
func (m *Metrics) AckUnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err == nil {
			m.count(info.FullMethod, resp)
		}
		return resp, err
	}
}

// AckStreamInterceptor counts each Ack a stream sends (whoever sends it: a rejecting
// interceptor or the handler).
func (m *Metrics) AckStreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &ackStream{ServerStream: ss, m: m, method: info.FullMethod})
	}
}

type ackStream struct {
	grpc.ServerStream
	m      *Metrics
	method string
}

func (s *ackStream) SendMsg(msg any) error {
	err := s.ServerStream.SendMsg(msg)
	if err == nil {
		s.m.count(s.method, msg)
	}
	return err
}
