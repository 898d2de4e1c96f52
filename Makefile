# Developer and CI entry points. `make test` is the README's test command.
SHELL := /bin/bash
BUF := tools/node_modules/.bin/buf
BIN := $(CURDIR)/bin

.PHONY: demo test tools protodeps gen lint breaking gencheck check gotest deploytest fuzz

demo:
	go run ./cmd/handoff demo

# Everything CI checks, in order: contract lint, breaking check against the previous commit,
# generated code up to date, every Go test, then the Kubernetes manifests and static
# binaries (their own module, so k8s.io/api stays out of the app's go.mod).
test: check gotest deploytest

check: lint breaking gencheck

# Pinned tools: buf from npm (seconds); protoc plugins and grpcurl (for the README recipe
# tests) from tools/go.mod.
tools: $(BUF) $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-jsonschema $(BIN)/grpcurl

$(BUF): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $(BUF)

$(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-jsonschema $(BIN)/grpcurl &: tools/go.mod tools/go.sum
	cd tools && GOBIN=$(BIN) go install tool

protodeps: .build/protovalidate/buf/validate/validate.proto

.build/protovalidate/buf/validate/validate.proto: tools/go.mod tools/go.sum tools/cmd/protovalidate-proto/main.go
	go run -C tools ./cmd/protovalidate-proto $(CURDIR)/.build/protovalidate

lint: tools protodeps
	$(BUF) lint

breaking: tools protodeps
	./scripts/buf-breaking.sh

# Regenerate from scratch; only hand-written files under gen/ survive.
gen: tools protodeps
	find gen -name '*.pb.go' -delete 2>/dev/null || true
	rm -f gen/jsonschema/*.json
	$(BUF) generate

# Fails when the committed generated code differs from a fresh generation.
gencheck: gen
	@git add -N gen >/dev/null 2>&1 || true
	@if ! git diff --exit-code --stat -- gen; then \
		echo "gen/ is out of date: run 'make gen' and commit the result" >&2; exit 1; fi

gotest: tools protodeps
	go test -count=1 ./...

deploytest:
	cd deploy/k8s/manifesttest && go test -count=1 ./...

# The decode+validate fuzz target; FUZZTIME=10m for a long run.
FUZZTIME ?= 30s
fuzz:
	go test ./internal/contract -run '^$$' -fuzz FuzzDecodeValidate -fuzztime $(FUZZTIME)
