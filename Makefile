# Developer and CI entry points. `make test` is the README's test command.
SHELL := /bin/bash
BUF := tools/node_modules/.bin/buf
BIN := $(CURDIR)/bin
# The TypeScript example (examples/agent-ts): protoc-gen-es and the runtime it generates for,
# pinned in its package.json.
TS_DIR := examples/agent-ts
PROTOC_GEN_ES := $(TS_DIR)/node_modules/.bin/protoc-gen-es

.PHONY: demo test tools protodeps gen lint breaking gencheck staticcheck check gotest deploytest peertest fuzz

demo:
	go run ./cmd/handoff demo

# Everything CI checks, in order: contract lint, breaking check against the previous commit,
# generated code up to date, staticcheck, every Go test, then the Kubernetes manifests and static
# binaries (their own module, so k8s.io/api stays out of the app's go.mod).
test: check gotest deploytest peertest

check: lint breaking gencheck staticcheck

# Pinned tools: buf from npm (seconds); protoc plugins, grpcurl (for the README recipe
# tests) and staticcheck from tools/go.mod; protoc-gen-es and the TypeScript example's packages from its
# package-lock.json (its Go test runs them).
tools: $(BUF) $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-jsonschema $(BIN)/grpcurl $(BIN)/staticcheck $(PROTOC_GEN_ES)

$(BUF): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $(BUF)

$(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-jsonschema $(BIN)/grpcurl $(BIN)/staticcheck &: tools/go.mod tools/go.sum
	cd tools && GOBIN=$(BIN) go install tool

$(PROTOC_GEN_ES): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $(PROTOC_GEN_ES)

protodeps: .build/protovalidate/buf/validate/validate.proto

.build/protovalidate/buf/validate/validate.proto: tools/go.mod tools/go.sum tools/cmd/protovalidate-proto/main.go
	go run -C tools ./cmd/protovalidate-proto $(CURDIR)/.build/protovalidate

lint: tools protodeps
	$(BUF) lint

breaking: tools protodeps
	./scripts/buf-breaking.sh

# Regenerate from scratch; only hand-written files under gen/ survive. Then the TypeScript
# of examples/agent-ts (buf.gen.ts.yaml; clean: true empties its src/gen first).
gen: tools protodeps
	find gen -name '*.pb.go' -delete 2>/dev/null || true
	rm -f gen/jsonschema/*.json
	$(BUF) generate
	$(BUF) generate --template buf.gen.ts.yaml
	rm -f deploy/k8s/base/pipelines/*.yaml
	cp pipelines/*.yaml deploy/k8s/base/pipelines/

# Fails when the committed generated code differs from a fresh generation: a changed or
# removed file (git diff), or a new one git does not know (ls-files --others). The index is
# left alone (no `git add -N`, which would also stage the removals and hide them).
GENERATED := gen $(TS_DIR)/src/gen deploy/k8s/base/pipelines
gencheck: gen
	@new=$$(git ls-files --others --exclude-standard -- $(GENERATED)); \
	if ! git diff --exit-code --stat -- $(GENERATED) || [ -n "$$new" ]; then \
		[ -z "$$new" ] || printf 'new, not in git:\n%s\n' "$$new" >&2; \
		echo "$(GENERATED) out of date: run 'make gen' and commit the result" >&2; exit 1; fi

# staticcheck's default checks over the app module (the manifest tests are their own module).
staticcheck: tools
	$(BIN)/staticcheck ./...

gotest: tools protodeps
	go test -count=1 ./...

deploytest:
	cd deploy/k8s/manifesttest && go test -count=1 ./...

# The peer benches' own unit tests (their ratios and judgements; no peer server is started).
# Each is its own module, so the Temporal and Restate SDKs stay out of the app's go.mod; the
# first build of the Temporal SDK takes ~1.5 min on two cores.
peertest:
	cd bench/restate && go test -count=1 ./...
	cd bench/temporal && go test -count=1 ./...

# The decode+validate fuzz target; FUZZTIME=10m for a long run.
FUZZTIME ?= 30s
fuzz:
	go test ./internal/contract -run '^$$' -fuzz FuzzDecodeValidate -fuzztime $(FUZZTIME)
