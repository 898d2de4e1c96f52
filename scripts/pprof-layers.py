#!/usr/bin/env python3
"""Splits a CPU (or alloc) profile of the hop or job benchmarks into the platform's layers.

Usage: go tool pprof -traces [-sample_index=alloc_space] BINARY PROFILE | scripts/pprof-layers.py

Each sample goes to the first layer whose pattern matches a frame, walking its stack from the
leaf up: time in protovalidate under the validate interceptor is validation, time in gRPC's
codec is encoding wherever it is called from, a Redis round trip (go-redis, its syscalls)
under store.PutRun is the save. Samples of the rigs' setup (newHopRig, newJobsRig,
NewValidator) are left out.
"""
import re
import sys

# (layer, regexp on a frame), tried in order for each frame from the leaf up; the first
# frame matching one decides. Libraries a layer calls (protovalidate, the otel SDK, the
# Prometheus client, slog, go-redis, syscalls, the allocator) match none, so their time goes
# to the layer that called them.
LAYERS = [
    ("encoding (gRPC codec: proto marshal/unmarshal)", r"google\.golang\.org/grpc/encoding|grpc\.encode$|grpc\.recvAndDecompress|grpc\.decompress"),
    ("stats handler (otelgrpc)", r"otelgrpc"),
    ("trace (interceptor, spans)", r"internal/interceptor/trace\."),
    ("metrics", r"providers/prometheus|internal/telemetry\."),
    ("logging", r"interceptors/logging|internal/rpc\.slogLogger|internal/rpc\.traceFields"),
    ("identity", r"internal/interceptor/identity\."),
    ("validation (version gate, contract, protovalidate)", r"internal/interceptor/validate\.|internal/contract\.|agentrunner\.\(\*Server\)\.version"),
    ("role", r"agentrunner\.\(\*Server\)\.role"),
    ("save (coordinator PutRun)", r"internal/store\.\(\*(Redis|Bolt)\)\.PutRun"),
    ("admission (claim + debit, Complete)", r"internal/interceptor/idempotency\.|internal/interceptor/budget\.|internal/store\.\(\*(Redis|Bolt)\)\.(Admit|Complete|Claim)|agentrunner\.\(\*Server\)\.(admit|record|replay)"),
    ("recovery, utf8, hop.Receive", r"interceptors/recovery|internal/rpc\.utf8|internal/interceptor/hop\."),
    ("handler + Noop agent", r"services/agentrunner\.|_AgentRunnerService_Deliver_Handler"),
    ("coordinator (J only)", r"services/coordinator\.|internal/pipeline|internal/demo"),
    ("bench client (package, rpc.Deliver)", r"internal/bench\.|internal/rpc\.Deliver|internal/rpc\.finish"),
    ("gRPC transport + HTTP/2", r"google\.golang\.org/grpc|golang\.org/x/net/http2"),
]
# When no frame matches a layer: the first of these from the leaf up.
FALLBACK = [
    ("store (other)", r"internal/store\."),
    ("GC", r"runtime\.gcBgMarkWorker|runtime\.gcDrain|runtime\.bgsweep|runtime\.bgscavenge|runtime\.markroot"),
    ("trace (interceptor, spans)", r"go\.opentelemetry\.io/otel"),
    ("Redis client (go-redis, background)", r"go-redis"),
    ("logging", r"^log/slog"),
    ("network syscalls (other)", r"^syscall\.|internal/poll|^net\."),
]
SETUP = re.compile(r"bench\.newHopRig|bench\.newJobsRig|bench\.newFloorRig|contract\.NewValidator|captureShape|bench\.hopRigFor|bench\.floorRigFor")

def parse(lines):
    val, stack = None, []
    for line in lines:
        if line.startswith("-----------+"):
            if val is not None:
                yield val, stack
            val, stack = None, []
            continue
        m = re.match(r"^\s+(\d+(?:\.\d+)?)(ns|us|µs|ms|s|B|kB|MB|GB)?\s+(\S.*)$", line)
        if m and val is None:
            unit = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1, "s": 1000, "B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, None: 1}[m.group(2)]
            val = float(m.group(1)) * unit
            stack.append(m.group(3).strip())
        elif val is not None and line.strip():
            stack.append(line.strip())
    if val is not None:
        yield val, stack

def main():
    pats = [(n, re.compile(p)) for n, p in LAYERS]
    fall = [(n, re.compile(p)) for n, p in FALLBACK]
    totals, total, setup = {}, 0.0, 0.0
    for val, stack in parse(sys.stdin):
        frames = [re.sub(r"\s*\(inline\)$", "", f) for f in stack]
        if any(SETUP.search(f) for f in frames):
            setup += val
            continue
        layer = None
        for f in frames:
            layer = next((n for n, p in pats if p.search(f)), None)
            if layer:
                break
        for f in frames if layer is None else []:
            layer = next((n for n, p in fall if p.search(f)), None)
            if layer:
                break
        layer = layer or "runtime (scheduler, other)"
        totals[layer] = totals.get(layer, 0.0) + val
        total += val
    for layer, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{100 * v / total:5.1f}%  {layer}")
    print(f"(total {total:.0f}, setup left out {setup:.0f}, in the profile's unit: ms or bytes)")

main()
