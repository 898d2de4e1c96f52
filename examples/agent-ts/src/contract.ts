// The handoff.v1 contract checks of this runner, mirroring the Go platform's
// internal/contract (version gate, size cap, protovalidate reasons, the Ack) and the agent
// runner's interceptor chain (internal/interceptor/validate, budget; services/agentrunner).
// The rules themselves are not restated here: protovalidate reads them from the proto
// annotations compiled into src/gen, the same annotations Go enforces.

import { create, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { Path } from "@bufbuild/protobuf/reflect";
import { createValidator, type Validator } from "@bufbuild/protovalidate";

import { CheckRequestSchema, DeliverRequestSchema, type CheckRequest, type DeliverRequest } from "./gen/handoff/v1/agentrunner_pb.js";
import {
  AckSchema,
  AckStatus,
  HandoffPackageSchema,
  ReasonSchema,
  type Ack,
  type HandoffPackage,
  type Reason,
} from "./gen/handoff/v1/handoff_pb.js";

/** The one contract version this runner reads (contract.V1). */
export const V1 = "handoff.v1";

/** A package's encoded size cap: 64 KiB (contract.MaxPackageBytes). */
export const MAX_PACKAGE_BYTES = 64 << 10;

// Rule ids the contract emits itself (internal/contract); the rest come from protovalidate.
export const RULE_REQUIRED = "required";
export const RULE_VERSION_ACCEPTED = "version.accepted";
export const RULE_SIZE_MAX = "size.max";
export const RULE_VALIDATE_ERROR = "validate.error";
// The runner's own rule ids (services/agentrunner, internal/interceptor/budget).
export const RULE_ROLE_AGENT = "role.agent";
export const RULE_ROLE_TOOLS = "role.tools";
export const RULE_BUDGET_EMPTY = "budget.empty";

/** The protovalidate instance; build it once (rules compile on first use per message type). */
export const validator: Validator = createValidator();

export function reason(field: string, rule: string, message: string): Reason {
  return create(ReasonSchema, { field, rule, message });
}

/** clip makes s at most n UTF-8 bytes without splitting a character (contract.clip). */
export function clipBytes(s: string, n: number, ellipsis = "…"): string {
  if (Buffer.byteLength(s, "utf8") <= n) return s;
  let out = "";
  let used = 0;
  for (const ch of s) {
    const b = Buffer.byteLength(ch, "utf8");
    if (used + b > n) break;
    out += ch;
    used += b;
  }
  return out + ellipsis;
}

/**
 * fieldPath renders a protovalidate path the way Go's protovalidate.FieldPathString does:
 * proto field names joined by ".", list indexes and map keys in brackets
 * ("artifacts[0].uri", "budget.usd_remaining_micros").
 */
export function fieldPath(path: Path): string {
  let out = "";
  for (const el of path) {
    switch (el.kind) {
      case "field":
      case "oneof":
        out += (out === "" ? "" : ".") + el.name;
        break;
      case "extension":
        out += (out === "" ? "" : ".") + "[" + el.typeName + "]";
        break;
      case "list_sub":
        out += "[" + el.index + "]";
        break;
      case "map_sub":
        out += "[" + (typeof el.key === "string" ? JSON.stringify(el.key) : String(el.key)) + "]";
        break;
    }
  }
  return out;
}

/** ValidationUnavailable is protovalidate failing to run: no verdict, but fail closed. */
export class ValidationUnavailable extends Error {}

/**
 * reasonsOf runs protovalidate on a message and returns one Reason per violation (Go's
 * contract.Reasons): field path, rule id, message ("violates <rule>" when the rule has none).
 */
export function reasonsOf<Desc extends DescMessage>(schema: Desc, msg: MessageShape<Desc>): Reason[] {
  const res = validator.validate(schema, msg);
  switch (res.kind) {
    case "valid":
      return [];
    case "error":
      throw new ValidationUnavailable(res.error.message);
    case "invalid":
      return res.violations.map((v) => reason(fieldPath(v.field), v.ruleId, v.message || "violates " + v.ruleId));
  }
}

/**
 * checkV1 is Go's Validator.CheckV1 for a consumer that accepts handoff.v1 only: the version
 * gate first (nothing else is read when it refuses), then the size cap, then the package's
 * protovalidate rules. An empty array means valid.
 */
export function checkV1(p: HandoffPackage | undefined): Reason[] {
  if (p === undefined) return [reason("", RULE_REQUIRED, "no package")];
  if (p.schema === "") {
    return [reason("schema", RULE_REQUIRED, `schema is required: name the contract version (accepted: ${V1})`)];
  }
  if (p.schema !== V1) {
    return [
      reason("schema", RULE_VERSION_ACCEPTED, `schema ${JSON.stringify(clipBytes(p.schema, 64))} is not an accepted version; this consumer accepts ${V1}`),
    ];
  }
  const size = toBinary(HandoffPackageSchema, p).length;
  if (size > MAX_PACKAGE_BYTES) {
    return [
      reason("", RULE_SIZE_MAX, `package is more than ${MAX_PACKAGE_BYTES} bytes, over the ${MAX_PACKAGE_BYTES} byte cap: pass artifacts and memory by reference`),
    ];
  }
  return reasonsOf(HandoffPackageSchema, p);
}

/** fit leaves out a value that does not fit the Ack's own field cap (contract.fit). */
function fit(s: string, n: number): string {
  return Buffer.byteLength(s, "utf8") > n ? "" : s;
}

/**
 * ackFor builds the Ack for a package (contract.AckFor): job_id, stage, schema and
 * traceparent are copied when they fit; more than 64 reasons are cut to 63 plus one
 * "reasons.truncated".
 */
export function ackFor(p: HandoffPackage | undefined, status: AckStatus, reasons: Reason[] = []): Ack {
  if (reasons.length > 64) {
    const more = reasons.length - 63;
    reasons = [...reasons.slice(0, 63), reason("", "reasons.truncated", `${more} more reasons not shown`)];
  }
  return create(AckSchema, {
    status,
    jobId: fit(p?.jobId ?? "", 128),
    stage: fit(p?.stage ?? "", 64),
    traceparent: fit(p?.trace?.traceparent ?? "", 55),
    schema: fit(p?.schema ?? "", 64),
    reasons,
  });
}

/** The outcome of the schema gate for one Deliver or Check request. */
export type SchemaGate =
  | { kind: "ok" }
  // A broken package: answer with this REJECTED_SCHEMA Ack.
  | { kind: "ack"; ack: Ack }
  // A valid package in a malformed request (agent, required_tools): InvalidArgument.
  | { kind: "bad_request"; reasons: Reason[] };

/**
 * schemaGate is the validate interceptor with PackageAckRejecter
 * (internal/interceptor/validate): the package is checked with checkV1, its reasons named
 * relative to the package ("job_id", "artifacts[0].uri"); when the gate or the size cap
 * refused it nothing else is read. Then the rest of the request is validated. Reasons about
 * the package answer REJECTED_SCHEMA; a valid package with a malformed agent or
 * required_tools is a broken request, not a package to reject.
 */
export function schemaGate(req: DeliverRequest | CheckRequest, schema: typeof DeliverRequestSchema | typeof CheckRequestSchema): SchemaGate {
  const p = req.package;
  if (req.packageV2 !== undefined) {
    // This runner reads handoff.v1 only (it has no Describe, which a sender takes as "v1
    // only"): a handoff.v2 package is refused naming its version, as the Go runner's version
    // gate does, before anything in it is read.
    const ack = ackFor(undefined, AckStatus.REJECTED_SCHEMA, [
      reason("schema", RULE_VERSION_ACCEPTED, `schema "handoff.v2" is not an accepted version; this consumer accepts ${V1}`),
    ]);
    ack.schema = "handoff.v2";
    return { kind: "ack", ack };
  }
  if (p === undefined) {
    return { kind: "ack", ack: ackFor(undefined, AckStatus.REJECTED_SCHEMA, [reason("", RULE_REQUIRED, "no package: the request carries no handoff package")]) };
  }
  const pr = checkV1(p);
  if (pr.some((r) => r.rule === RULE_VALIDATE_ERROR)) throw new ValidationUnavailable(pr[0].message);
  if (pr.length > 0) {
    // Go also validates the rest of the request here (unless the gate stopped), but the Ack
    // carries only the package's reasons, so there is nothing more to read.
    return { kind: "ack", ack: ackFor(p, AckStatus.REJECTED_SCHEMA, pr) };
  }
  const rest = reasonsOf(schema as DescMessage, req as never).filter((r) => r.field !== "package" && !r.field.startsWith("package."));
  return rest.length > 0 ? { kind: "bad_request", reasons: rest } : { kind: "ok" };
}

/** The card of the one agent this runner serves. */
export type RoleCard = { name: string; tools: string[] };

/**
 * roleGate is the runner's role interceptor: the agent is req.agent, or the package's stage
 * when empty; another name -> REJECTED_ROLE (field "agent"/"stage", rule "role.agent"); a
 * required tool the card lacks -> REJECTED_ROLE, one reason per tool ("required_tools[i]",
 * rule "role.tools"). undefined: the card serves it.
 */
export function roleGate(req: DeliverRequest | CheckRequest, card: RoleCard): Ack | undefined {
  const p = req.package!;
  const [name, field] = req.agent !== "" ? [req.agent, "agent"] : [p.stage, "stage"];
  if (name !== card.name) {
    return ackFor(p, AckStatus.REJECTED_ROLE, [reason(field, RULE_ROLE_AGENT, `no agent ${JSON.stringify(name)} on this runner`)]);
  }
  const missing = req.requiredTools.flatMap((t, i) =>
    card.tools.includes(t) ? [] : [reason(`required_tools[${i}]`, RULE_ROLE_TOOLS, `agent ${JSON.stringify(name)} does not hold tool ${JSON.stringify(clipBytes(t, 128))}`)],
  );
  return missing.length > 0 ? ackFor(p, AckStatus.REJECTED_ROLE, missing) : undefined;
}

/**
 * budgetGate checks the package's own wallet numbers, as the Go budget interceptor does for
 * a wallet its store does not hold: this runner shares no store with the rail, so it never
 * debits (the Ack carries no wallet and the coordinator takes the hop itself).
 */
export function budgetGate(p: HandoffPackage): Ack | undefined {
  const b = p.budget;
  const out: Reason[] = [];
  if ((b?.usdRemainingMicros ?? 0n) <= 0n) out.push(reason("budget.usd_remaining_micros", RULE_BUDGET_EMPTY, "no money left in the job's wallet"));
  if ((b?.hopsRemaining ?? 0) === 0) out.push(reason("budget.hops_remaining", RULE_BUDGET_EMPTY, "no hops left in the job's wallet"));
  return out.length > 0 ? ackFor(p, AckStatus.REJECTED_BUDGET, out) : undefined;
}

/**
 * completionKey is the stage's idempotency key, the same as the Go runner's:
 * "stage:<job_id>:<stage>:<round>", with ":o<operator_returns>" once a person has sent the
 * job back to a stage, and ":v<visit>" when a route sent the job back to a stage it was at
 * (so that stage runs again instead of answering DUPLICATE).
 */
export function completionKey(p: HandoffPackage): string {
  let key = `stage:${p.jobId}:${p.stage}:${p.evaluator?.rounds ?? 0}`;
  if (p.operatorReturns > 0) key += `:o${p.operatorReturns}`;
  if (p.visit > 0) key += `:v${p.visit}`;
  return key;
}
