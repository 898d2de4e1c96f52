// A coordinator client in TypeScript: stores a raw ticket as the job's input artifact,
// submits the job (CoordinatorService.SubmitJob) and watches it (WatchJob), printing one line
// per event. Exit status: 0 when the run COMPLETED, 1 when it ended otherwise (escalated,
// failed), 2 on a usage or connection error.
//
// Usage: tsx src/client.ts [--coordinator HOST:PORT] [--artifacts DIR] [--ticket FILE]
//                          [--job-id ID] [--request-id ID] [--pipeline NAME] [--goal TEXT]
//                          [--token TOKEN]
//   --coordinator  HANDOFF_COORDINATOR, else 127.0.0.1:50051 (`handoff up`)
//   --token        HANDOFF_OPERATOR_TOKEN: watching a job needs an identity, and on plaintext
//                  loopback this client's is the operator token `handoff up` prints
//   --artifacts    HANDOFF_ARTIFACTS, else <repository>/handoff-data/artifacts (`handoff up`'s):
//                  the folder the stages share
//   --ticket       a raw_ticket.v1 JSON file; default: the Go agents' sample ticket

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { DEFAULT_ROOT, FileStore } from "./artifacts.js";
import { CoordinatorService, EventKind, JobState, type JobEvent } from "./gen/handoff/v1/coordinator_pb.js";
import { AckStatus, BudgetSchema, Verdict, type Budget } from "./gen/handoff/v1/handoff_pb.js";

const sampleTicket = fileURLToPath(new URL("../../../services/agentrunner/support/testdata/sample_ticket.json", import.meta.url));

function money(micros: bigint): string {
  const neg = micros < 0n;
  const m = neg ? -micros : micros;
  return `${neg ? "-" : ""}$${m / 1_000_000n}.${String(m % 1_000_000n).padStart(6, "0")}`;
}

function wallet(b: Budget | undefined): string {
  return b ? `${money(b.usdRemainingMicros)} r${b.revisionsRemaining} h${b.hopsRemaining}` : "";
}

/** describe is one event as a line: what happened at which hop. */
function describe(ev: JobEvent): string {
  let what = "";
  switch (ev.kind) {
    case EventKind.ACK: {
      what = AckStatus[ev.ack?.status ?? 0];
      const rs = ev.ack?.reasons ?? [];
      if (rs.length > 0) what += " " + rs.map((r) => `${r.field || "(package)"}:${r.rule}`).join(", ");
      break;
    }
    case EventKind.STAGE_RESULT: {
      const r = ev.result;
      what = `${r?.artifacts.map((a) => a.schemaVersion).join(",") || "no artifact"} (spent ${money(r?.spentUsdMicros ?? 0n)})`;
      if (r?.error) what += ` error: ${r.error}`;
      break;
    }
    case EventKind.VERDICT:
      what = Verdict[ev.evaluator?.lastVerdict ?? 0] + (ev.evaluator?.failures.length ? " " + ev.evaluator.failures.map((f) => f.code).join(",") : "");
      break;
    case EventKind.RECEIPT:
      what = `${ev.receipt?.externalId} key ${ev.receipt?.idempotencyKey}`;
      break;
    case EventKind.ESCALATED:
      what = `${ev.escalation?.detail ?? ""}`;
      break;
  }
  return `${String(ev.seq).padStart(3)}  hop ${String(ev.hop).padStart(2)}  ${ev.stage.padEnd(10)} ${EventKind[ev.kind].padEnd(13)} ${what}`.trimEnd() + (ev.wallet ? `  [${wallet(ev.wallet)}]` : "");
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      coordinator: { type: "string" },
      artifacts: { type: "string" },
      ticket: { type: "string" },
      "job-id": { type: "string" },
      "request-id": { type: "string" },
      pipeline: { type: "string" },
      goal: { type: "string" },
      token: { type: "string" },
    },
  });
  const coordinator = values.coordinator ?? process.env.HANDOFF_COORDINATOR ?? "127.0.0.1:50051";
  const store = new FileStore(values.artifacts ?? process.env.HANDOFF_ARTIFACTS ?? DEFAULT_ROOT);
  const jobId = values["job-id"] ?? "tkt_ts_" + randomBytes(3).toString("hex");
  const pipeline = values.pipeline ?? "support-ticket";
  const goal = values.goal ?? "Draft internal triage summary; do not send to customer";

  // The job's input by reference: the raw ticket in the shared artifact folder.
  const ticket = await readFile(values.ticket ?? sampleTicket);
  const input = await store.put({ jobId, stage: "submit", round: 0, type: "raw_ticket", schemaVersion: "raw_ticket.v1", mediaType: "application/json" }, ticket);

  const token = values.token ?? process.env.HANDOFF_OPERATOR_TOKEN ?? "";
  const client = createClient(
    CoordinatorService,
    createGrpcTransport({
      baseUrl: `http://${coordinator}`,
      interceptors: token ? [(next) => (req) => (req.header.set("authorization", `Bearer ${token}`), next(req))] : [],
    }),
  );
  const { job } = await client.submitJob({
    requestId: values["request-id"] ?? `ts-${jobId}`,
    jobId,
    pipeline,
    goal,
    constraints: ["no refund promises", "cite help center or no_match"],
    budget: create(BudgetSchema, { usdRemainingMicros: 1_200_000n }),
    inputs: [input],
    memoryRefs: ["customer_id:cus_9"],
  });
  if (!job) throw new Error("SubmitJob answered without a job");
  console.log(`run ${job.runId}  job ${job.jobId}  pipeline ${job.pipeline}  traceparent ${job.traceparent}`);

  const signal = AbortSignal.timeout(120_000);
  let last: JobEvent | undefined;
  for await (const msg of client.watchJob({ runId: job.runId }, { signal })) {
    if (!msg.event) continue;
    last = msg.event;
    console.log(describe(msg.event));
  }
  const { job: end } = await client.getJob({ runId: job.runId });
  const state = end?.state ?? JobState.UNSPECIFIED;
  const receipt = end?.receipt;
  console.log(
    `run ${job.runId} ${JobState[state]}` +
      (receipt ? `  receipt ${receipt.externalId} key ${receipt.idempotencyKey}` : "") +
      (end?.escalation ? `  escalated at ${end.escalation.stage}: ${end.escalation.detail}` : "") +
      `  (last event ${last ? EventKind[last.kind] : "none"})`,
  );
  return state === JobState.COMPLETED ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`client: ${err instanceof ConnectError ? `${Code[err.code]}: ${err.rawMessage}` : err instanceof Error ? err.message : String(err)}`);
    process.exit(2);
  },
);
