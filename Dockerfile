# syntax=docker/dockerfile:1
#
# Images for the three handoff services and the handoff CLI, one target each:
#
#   docker build --target coordinator -t handoff/coordinator .
#   docker build --target agentrunner -t handoff/agentrunner .
#   docker build --target writeback   -t handoff/writeback .
#   docker build --target handoff     -t handoff/cli .
#
# No Docker engine is available on our build machines, so this image build itself is not
# tested here. What is tested (deploy/k8s/manifesttest): the exact `go build` below makes
# static binaries (no ELF interpreter, no shared libraries), so they run on distroless
# static; the probe command the manifests run passes against the real coordinator over
# mTLS; and this file's targets, users, ports and paths match the Kubernetes manifests.
#
# Each service image also holds grpc_health_probe: the pods' readiness and liveness probes
# exec it, because the services speak mTLS only and the kubelet's own gRPC probe cannot
# (deploy/k8s/README.md). Its version is pinned by the `tool` line in
# deploy/k8s/manifesttest/go.mod and checked against that module's go.sum.

# golang:1.26 must be Go 1.26.8 or newer (go.mod says so; the image sets GOTOOLCHAIN=local).
FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0

# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
COPY deploy/k8s/manifesttest/go.mod deploy/k8s/manifesttest/go.sum deploy/k8s/manifesttest/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/coordinator ./cmd/agentrunner ./cmd/writeback ./cmd/handoff \
 && go build -C deploy/k8s/manifesttest -trimpath -ldflags='-s -w' -o /out/grpc_health_probe github.com/grpc-ecosystem/grpc-health-probe

# distroless static, nonroot variant: no shell, no package manager, uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot AS coordinator
COPY --from=build /out/coordinator /usr/local/bin/coordinator
COPY --from=build /out/grpc_health_probe /usr/local/bin/grpc_health_probe
# Listen on every interface (the binary's own default is loopback). mTLS is still required:
# pass --certs DIR (the manifests set HANDOFF_CERTS).
ENV HANDOFF_COORDINATOR_LISTEN=:50051
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/coordinator"]

FROM gcr.io/distroless/static-debian12:nonroot AS agentrunner
COPY --from=build /out/agentrunner /usr/local/bin/agentrunner
COPY --from=build /out/grpc_health_probe /usr/local/bin/grpc_health_probe
ENV HANDOFF_AGENTRUNNER_LISTEN=:50052
USER 65532:65532
EXPOSE 50052
ENTRYPOINT ["/usr/local/bin/agentrunner"]

FROM gcr.io/distroless/static-debian12:nonroot AS writeback
COPY --from=build /out/writeback /usr/local/bin/writeback
COPY --from=build /out/grpc_health_probe /usr/local/bin/grpc_health_probe
ENV HANDOFF_WRITEBACK_LISTEN=:50053
USER 65532:65532
EXPOSE 50053
ENTRYPOINT ["/usr/local/bin/writeback"]

# The CLI (validate, schema, lint, certs, up, demo), e.g.
#   docker run --rm -v "$PWD/certs:/certs" handoff/cli certs --dir /certs
FROM gcr.io/distroless/static-debian12:nonroot AS handoff
COPY --from=build /out/handoff /usr/local/bin/handoff
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/handoff"]
