// A handoff.v1 AgentRunnerService in TypeScript: Connect for Node speaking gRPC over HTTP/2,
// plaintext on loopback, serving one stage of the support-ticket pipeline, the drafter.
// Name its address in the stage's `runner:` field and the Go coordinator delivers the draft
// stage here:
//
//   - name: draft
//     runner: 127.0.0.1:50062
//
// Every package is answered with an Ack before any work, in the order of the Go runner's
// chain (services/agentrunner/chain.go): schema (REJECTED_SCHEMA, one reason per broken rule,
// checked by protovalidate against the proto annotations), role (REJECTED_ROLE unless the
// agent, or the stage when no agent is named, is "draft"), the stage's completion key
// (DUPLICATE with the first result; Aborted while it is in flight), the job's wallet
// (REJECTED_BUDGET when the package's own numbers are empty). Only after ACCEPTED does the
// drafter run, and one StageResult follows. Check answers with the Ack alone.
//
// The service identity the coordinator sends (a signed token in the metadata) is not checked:
// this example listens on loopback only. Completion records live in memory, per process.
//
// Usage: tsx src/runner.ts [--port N] [--artifacts DIR]
//   --port       HANDOFF_AGENT_TS_PORT, else PORT, else 50062; 0 picks a free port
//   --artifacts  HANDOFF_ARTIFACTS, else <repository>/handoff-data/artifacts (`handoff up`'s):
//                the folder every stage of the deployment shares
// It prints "listening on 127.0.0.1:PORT" when ready, then one JSON line per call.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { createServer } from "node:http2";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";

import { DEFAULT_ROOT, FileStore } from "./artifacts.js";
import {
  ackFor,
  budgetGate,
  completionKey,
  reasonsOf,
  roleGate,
  schemaGate,
  ValidationUnavailable,
  type RoleCard,
} from "./contract.js";
import { draft, STAGE_DRAFT } from "./draft.js";
import {
  AgentRunnerService,
  CheckRequestSchema,
  DeliverRequestSchema,
  DeliverResponseSchema,
  StageResultSchema,
  StageStatus,
  type CheckRequest,
  type DeliverRequest,
  type StageResult,
} from "./gen/handoff/v1/agentrunner_pb.js";
import { AckSchema, AckStatus, PriorResultSchema, type Ack, type HandoffPackage, type PriorResult, type Reason } from "./gen/handoff/v1/handoff_pb.js";

const HOST = "127.0.0.1";
const DEFAULT_PORT = 50062;
/** Bounds one agent run, as the Go runner's DefaultStageTimeout. */
const STAGE_TIMEOUT_MS = 60_000;

/** The role card of the one agent served here: the drafter holds no tools. */
const CARD: RoleCard = { name: STAGE_DRAFT, tools: [] };

type Options = { port: number; artifacts: string };

function options(argv: string[]): Options {
  const { values, positionals } = parseArgs({
    args: argv,
    options: { port: { type: "string" }, artifacts: { type: "string" }, help: { type: "boolean", short: "h" } },
    allowPositionals: true,
  });
  if (values.help) {
    process.stdout.write("usage: tsx src/runner.ts [--port N] [--artifacts DIR]\n");
    process.exit(0);
  }
  const raw = values.port ?? positionals[0] ?? process.env.HANDOFF_AGENT_TS_PORT ?? process.env.PORT ?? String(DEFAULT_PORT);
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write(`runner: port ${JSON.stringify(raw)} is not a TCP port\n`);
    process.exit(2);
  }
  return { port, artifacts: values.artifacts ?? process.env.HANDOFF_ARTIFACTS ?? DEFAULT_ROOT };
}

/** log prints one JSON line per call on stdout: the runner's record of what it served. */
function log(entry: Record<string, unknown>): void {
  process.stdout.write(JSON.stringify({ time: new Date().toISOString(), ...entry }) + "\n");
}

function reasonsLog(rs: Reason[]): { field: string; rule: string; message: string }[] {
  return rs.map((r) => ({ field: r.field, rule: r.rule, message: r.message }));
}

function logAck(rpc: string, p: HandoffPackage | undefined, ack: Ack): void {
  log({
    rpc,
    job_id: p?.jobId ?? "",
    stage: p?.stage ?? "",
    round: p?.evaluator?.rounds ?? 0,
    ack: AckStatus[ack.status],
    reasons: reasonsLog(ack.reasons),
  });
}

/** invalidArgument mirrors Go's validate.InvalidArgument message: "field: message" pairs. */
function invalidArgument(reasons: Reason[]): ConnectError {
  const parts = reasons.slice(0, 16).map((r) => `${r.field || "(request)"}: ${r.message}`);
  if (reasons.length > 16) parts.push(`and ${reasons.length - 16} more`);
  return new ConnectError("invalid request: " + parts.join("; "), Code.InvalidArgument);
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`agent ${CARD.name}: stage timeout after ${ms / 1000}s`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export function createRunner(store: FileStore) {
  // Completion records (CompletionKey -> the first completion), and keys in flight.
  const done = new Map<string, PriorResult>();
  const pending = new Set<string>();

  /** The gates both methods share, in the Go chain's order; an Ack when one refuses. */
  function admit(req: DeliverRequest | CheckRequest, rpc: "Deliver" | "Check"): Ack | undefined {
    let gate;
    try {
      gate = schemaGate(req, rpc === "Deliver" ? DeliverRequestSchema : CheckRequestSchema);
    } catch (err) {
      if (err instanceof ValidationUnavailable) throw new ConnectError(`package validation could not run: ${err.message}`, Code.Internal);
      throw err;
    }
    switch (gate.kind) {
      case "ack":
        return gate.ack;
      case "bad_request":
        log({ rpc, job_id: req.package?.jobId ?? "", stage: req.package?.stage ?? "", error: "InvalidArgument", reasons: reasonsLog(gate.reasons) });
        throw invalidArgument(gate.reasons);
    }
    return roleGate(req, CARD);
  }

  async function run(p: HandoffPackage): Promise<{ result: StageResult; revising?: boolean }> {
    try {
      const out = await withTimeout(draft(store, p), STAGE_TIMEOUT_MS);
      const bad = reasonsOf(StageResultSchema, out.result);
      if (bad.length > 0) throw new Error("agent result is invalid: " + bad.map((r) => `${r.field}: ${r.message}`).join("; "));
      return out;
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      const failed = create(StageResultSchema, {
        jobId: p.jobId,
        stage: p.stage,
        status: StageStatus.FAILED,
        error: `agent ${CARD.name}: ${msg}`.slice(0, 2000),
        traceparent: p.trace?.traceparent ?? "",
      });
      return { result: failed };
    }
  }

  return (router: ConnectRouter) =>
    router.service(AgentRunnerService, {
      async *deliver(req: DeliverRequest): AsyncGenerator<MessageInitShape<typeof DeliverResponseSchema>> {
        const p = req.package;
        let ack = admit(req, "Deliver");
        const key = p ? completionKey(p) : "";
        if (ack === undefined) {
          // The completion key, before the wallet (as in Go): a re-delivery does not pay twice.
          const prior = done.get(key);
          if (prior !== undefined) {
            ack = ackFor(p, AckStatus.DUPLICATE);
            ack.prior = prior;
          } else if (pending.has(key)) {
            log({ rpc: "Deliver", job_id: p!.jobId, stage: p!.stage, error: "Aborted" });
            throw new ConnectError(`stage ${key} is in flight on another delivery; retry later`, Code.Aborted);
          } else {
            ack = budgetGate(p!);
          }
        }
        if (ack !== undefined) {
          logAck("Deliver", p, ack);
          yield { event: { case: "ack", value: ack } };
          return;
        }

        // The Ack goes first, before any work.
        pending.add(key);
        try {
          const accepted = ackFor(p, AckStatus.ACCEPTED);
          logAck("Deliver", p, accepted);
          yield { event: { case: "ack", value: accepted } };

          const started = Date.now();
          const { result, revising } = await run(p!);
          if (result.status === StageStatus.COMPLETED) {
            // Recorded before it is sent, so a retry after a lost answer gets it as DUPLICATE.
            done.set(key, create(PriorResultSchema, { artifacts: result.artifacts, completedAt: timestampNow(), nextHint: result.nextHint, route: result.route }));
          }
          log({
            rpc: "Deliver",
            event: "result",
            job_id: p!.jobId,
            stage: p!.stage,
            round: p!.evaluator?.rounds ?? 0,
            status: StageStatus[result.status],
            revising: revising ?? false,
            artifacts: result.artifacts.map((a) => a.uri),
            error: result.error || undefined,
            ms: Date.now() - started,
          });
          yield { event: { case: "result", value: result } };
        } finally {
          pending.delete(key);
        }
      },

      async check(req: CheckRequest) {
        const p = req.package;
        let ack = admit(req, "Check");
        if (ack === undefined) ack = budgetGate(p!);
        if (ack === undefined) {
          const key = completionKey(p!);
          const prior = done.get(key);
          if (prior !== undefined) {
            ack = ackFor(p, AckStatus.DUPLICATE);
            ack.prior = prior;
          } else if (pending.has(key)) {
            throw new ConnectError(`stage ${key} is in flight on another delivery; retry later`, Code.Aborted);
          } else {
            ack = ackFor(p, AckStatus.ACCEPTED);
          }
        }
        logAck("Check", p, ack);
        return { ack: create(AckSchema, ack) };
      },
    });
}

function main(): void {
  const opts = options(process.argv.slice(2));
  const store = new FileStore(opts.artifacts);
  // gRPC only (HTTP/2, h2c): the protocol the Go coordinator and grpcurl speak.
  const handler = connectNodeAdapter({ routes: createRunner(store), grpc: true, grpcWeb: false, connect: false });
  const server = createServer(handler);
  server.on("error", (err) => {
    process.stderr.write(`runner: ${err.message}\n`);
    process.exit(1);
  });
  server.listen(opts.port, HOST, () => {
    const { port } = server.address() as AddressInfo;
    process.stdout.write(`listening on ${HOST}:${port}\n`);
    process.stderr.write(`runner: serving handoff.v1.AgentRunnerService (agent ${CARD.name}) with artifacts in ${store.root}\n`);
  });
  const stop = () => {
    server.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 2000).unref();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
