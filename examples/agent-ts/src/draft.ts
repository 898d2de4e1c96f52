// The drafter of the support-ticket pipeline, ported from the Go draft agent
// (services/agentrunner/support/draft.go): it reads the newest intake.v1 and chunks.v1
// artifacts and writes summary_md.v1, an internal triage summary whose every claim line cites
// a help-center chunk key ("[hc-refund-policy]"). It never promises a refund and never
// addresses the customer.
//
// Its critique loop is deterministic, like the Go drafter's: a first draft (no evaluator
// FAIL in the package) leaves the second claim without its citation, so the judge fails it
// once with citation_missing; a package carrying a FAIL is revised for each failure code
// (citation_missing, citation_invalid, refund_promise, constraint_broken), and a code it does
// not know becomes an open question for a human.

import { create } from "@bufbuild/protobuf";

import { verify, type FileStore } from "./artifacts.js";
import { StageResultSchema, StageStatus, type StageResult } from "./gen/handoff/v1/agentrunner_pb.js";
import { Verdict, type Artifact, type HandoffPackage } from "./gen/handoff/v1/handoff_pb.js";

export const STAGE_DRAFT = "draft";
export const TYPE_INTAKE = "intake";
export const TYPE_CHUNKS = "chunks";
export const TYPE_SUMMARY = "summary_md";
export const SCHEMA_SUMMARY = "summary_md.v1";
export const MEDIA_MARKDOWN = "text/markdown";
/** Fixed spend per run in micro-USD (support.SpendDraft). */
export const SPEND_DRAFT = 4000n;

const CITATION_MISSING = "citation_missing";
const CITATION_INVALID = "citation_invalid";
const REFUND_PROMISE = "refund_promise";
const CONSTRAINT_BROKEN = "constraint_broken";

/** intake.v1, intake's output. */
type Intake = { ticket_id?: string; customer_id?: string; category?: string; question?: string; facts?: string[] | null };
/** chunks.v1, retrieve's output. */
type Chunks = { query?: string; chunks?: { key: string; title?: string; text: string; score?: number }[] | null; no_hit?: boolean };

// The judge's patterns (support/judge.go): a line that promises a refund, or greets or signs
// off to the customer, never goes into a summary.
const refundPromise =
  /\b(we(?:'ll| will| shall| are going to) (?:issue (?:you )?|process )?(?:a |your |the )?(?:full )?refund|you(?:'ll| will) (?:get|receive|be given) (?:a |your |the )?(?:full )?refund|refund you\b|refund(?:ing)? your (?:money|payment|charge)|guarantee(?:d|s)? (?:you )?(?:a |the |your )?(?:full )?refund|(?:a |your )?refund is guaranteed)/i;
const greeting =
  /^[\t\n\f\r ]*(?:[-*][\t\n\f\r ]*)?(?:dear\b|hi\b|hello\b|hey\b|good (?:morning|afternoon|evening)\b)|\b(?:kind|best|warm) regards\b|\bsincerely\b|\byours truly\b/i;
const sentenceEnd = /[.!?]([\t\n\f\r ]+|$)/;

/** The recommended action per intake category. */
const nextStep: Record<string, string> = {
  billing_double_charge:
    "Route to the billing team to check whether the second charge is a pending authorisation or a settled duplicate; any reversal or refund is billing's decision, so the reply must not promise one.",
  refund_request: "Route to the billing team, which decides on refunds under the refund policy; the reply must not promise one.",
  account_access: "Point the customer to the self-service reset; hand lost two-factor devices to the account-security team.",
  shipping: "Check the tracking status; past 5 business days without an update, ask logistics to open a courier trace.",
  subscription: "Confirm how to cancel from the billing settings and what happens to the current period.",
};

type Claim = { text: string; keys: string[] };

/** sentences splits an article's text into sentences. */
export function sentences(text: string): string[] {
  const out: string[] = [];
  while (text !== "") {
    const m = sentenceEnd.exec(text);
    if (m === null) {
      out.push(text.trim());
      break;
    }
    out.push(text.slice(0, m.index + 1).trim());
    text = text.slice(m.index + m[0].length);
  }
  return out;
}

/** clip shortens s to at most n UTF-8 bytes without splitting a character (support.clip). */
export function clip(s: string, n: number): string {
  if (Buffer.byteLength(s, "utf8") <= n) return s;
  let out = "";
  let used = 0;
  for (const ch of s) {
    const b = Buffer.byteLength(ch, "utf8");
    if (used + b > n - 3) break;
    out += ch;
    used += b;
  }
  return out + "...";
}

/** questions dedupes, drops empties and caps open questions to what a package accepts. */
export function questions(...qs: string[]): string[] {
  const out: string[] = [];
  const seen = new Set<string>();
  for (let q of qs) {
    q = clip(q.trim(), 500);
    if (q === "" || seen.has(q)) continue;
    seen.add(q);
    out.push(q);
    if (out.length === 32) break;
  }
  return out;
}

/** latest is the newest artifact of a type in the package (the rail appends). */
function latest(p: HandoffPackage, type: string): Artifact | undefined {
  for (let i = p.artifacts.length - 1; i >= 0; i--) {
    if (p.artifacts[i].type === type) return p.artifacts[i];
  }
  return undefined;
}

async function readJSON<T>(store: FileStore, p: HandoffPackage, type: string): Promise<T> {
  const a = latest(p, type);
  if (a === undefined) throw new Error(`missing input artifact: the package carries no ${JSON.stringify(type)} artifact`);
  let data: Buffer;
  try {
    data = await store.get(a.uri);
  } catch (err) {
    throw new Error(`reading ${type} artifact: ${(err as Error).message}`);
  }
  verify(a, data);
  try {
    return JSON.parse(data.toString("utf8")) as T;
  } catch (err) {
    throw new Error(`${type} artifact (${a.uri}) is not valid ${a.schemaVersion} JSON: ${(err as Error).message}`);
  }
}

function line(c: Claim): string {
  return "- " + c.text + c.keys.map((k) => ` [${k}]`).join("") + "\n";
}

/** What one draft produced, besides the StageResult: for the runner's call log. */
export type DraftOutcome = { result: StageResult; revising: boolean; summary: string };

/**
 * draft runs the drafter for an accepted package. round is the number of judge verdicts the
 * job has had (evaluator.rounds): the artifact is stored under it, so a revision never
 * overwrites the draft the judge failed. Errors fail the stage (the runner turns them into a
 * STAGE_STATUS_FAILED result).
 */
export async function draft(store: FileStore, p: HandoffPackage): Promise<DraftOutcome> {
  const round = p.evaluator?.rounds ?? 0;
  const it = await readJSON<Intake>(store, p, TYPE_INTAKE);
  const ch = await readJSON<Chunks>(store, p, TYPE_CHUNKS);
  const chunks = ch.chunks ?? [];
  if (ch.no_hit || chunks.length === 0) {
    throw new Error("retrieve found no help-center article (no_hit): draft has nothing to cite and does not write from memory; escalate to a human");
  }

  const ev = p.evaluator;
  const revising = ev?.lastVerdict === Verdict.FAIL && ev.failures.length > 0;
  const addressed: string[] = [];
  const unknown: string[] = [];
  const valid = new Set(chunks.map((c) => c.key));

  // Claims: the first sentence of each chunk, then the second sentence of the best one.
  const claims: Claim[] = [];
  for (const c of chunks) {
    const s = sentences(c.text);
    if (s.length > 0) claims.push({ text: s[0], keys: [c.key] });
  }
  const best = sentences(chunks[0].text);
  if (best.length > 1) claims.push({ text: best[1], keys: [chunks[0].key] });
  const category = it.category ?? "";
  const step = nextStep[category] ?? "Answer from the cited articles; escalate to a human where they do not cover the question.";
  const stepKeys = [chunks[0].key];
  for (const c of chunks.slice(1)) {
    if (step.includes("refund") && c.key === "hc-refund-policy") stepKeys.push(c.key);
  }
  const nextClaim: Claim = { text: step, keys: stepKeys };

  if (!revising) {
    // First draft: the second claim loses its citation (the mistake the judge catches).
    if (claims.length > 1) claims[1].keys = [];
    else nextClaim.keys = [];
  } else {
    for (const f of ev!.failures) {
      switch (f.code) {
        case CITATION_MISSING:
        case CITATION_INVALID:
        case REFUND_PROMISE:
        case CONSTRAINT_BROKEN:
          // Every claim is built with its own source key, from the chunks only, and no line
          // is allowed to promise a refund or speak to the customer (below).
          if (!addressed.includes(f.code)) addressed.push(f.code);
          break;
        default:
          unknown.push(`judge failure ${f.code} is not something draft can revise automatically: ${f.detail}`);
      }
    }
  }
  // Whatever the round: cite only keys the chunks carry, and drop any line that would promise
  // a refund or greet the customer.
  const keep = (c: Claim): Claim | undefined =>
    refundPromise.test(c.text) || greeting.test(c.text) ? undefined : { text: c.text, keys: c.keys.filter((k) => valid.has(k)) };

  let md = `# Triage summary: ticket ${it.ticket_id ?? ""}\n\n`;
  md += "> Internal triage note for the support team; not for sending to the customer.\n";
  let header = `> Customer ${it.customer_id ? it.customer_id : "(unknown)"}, category ${category}`;
  const q = (it.question ?? "").trim();
  if (q !== "" && !refundPromise.test(q)) header += `, asks: "${q}"`;
  if (!header.endsWith('?"')) header += ".";
  md += header + "\n";
  const facts = it.facts ?? [];
  if (facts.length > 0) md += `> Ticket facts: ${facts.join("; ")}.\n`;
  md += "\n## Findings\n\n";
  for (const c of claims) {
    const k = keep(c);
    if (k) md += line(k);
  }
  md += "\n## Recommended next step\n\n";
  const k = keep(nextClaim);
  if (k) md += line(k);
  const open = questions(...p.openQuestions, ...unknown);
  if (open.length > 0) {
    md += "\n## Open questions\n\n";
    for (const oq of open) md += "- " + oq + "\n";
  }

  const art = await store.put(
    { jobId: p.jobId, stage: p.stage, round, type: TYPE_SUMMARY, schemaVersion: SCHEMA_SUMMARY, mediaType: MEDIA_MARKDOWN },
    Buffer.from(md, "utf8"),
  );
  let hint = "judge the summary against the rubric";
  if (revising) {
    const left = unknown.length > 0 ? [`${unknown.length} unknown code(s) left for a human`] : [];
    hint = `revision for round ${round} addresses: ${[...addressed, ...left].join(", ")}; judge again`;
  }
  const result = create(StageResultSchema, {
    jobId: p.jobId,
    stage: p.stage,
    status: StageStatus.COMPLETED,
    artifacts: [art],
    spentUsdMicros: SPEND_DRAFT,
    openQuestions: questions(...unknown),
    nextHint: clip(hint, 1000),
    traceparent: p.trace?.traceparent ?? "",
  });
  return { result, revising, summary: md };
}
