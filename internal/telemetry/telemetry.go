// Package telemetry sets up tracing and metrics for a service: an OpenTelemetry tracer
// provider (exporting over OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set) and a
// Prometheus registry with the gRPC and ack metrics. genai.go adds the OpenTelemetry GenAI
// agent and tool spans (invoke_agent, execute_tool) an agent runner starts when asked to.
package telemetry

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// NewTracerProvider returns an SDK tracer provider for service. It always makes real trace
// and span ids (the hops' traceparents come from it); it exports spans over OTLP/gRPC only
// when OTEL_EXPORTER_OTLP_ENDPOINT is set (the exporter reads the standard OTEL_* settings).
// Shut it down on exit to flush.
func NewTracerProvider(ctx context.Context, service string, extra ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, error) {
	res := resource.NewSchemaless(semconv.ServiceName(service))
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	return sdktrace.NewTracerProvider(append(opts, extra...)...), nil
}
