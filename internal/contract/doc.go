// Package contract is the handoff contract (proto/handoff/v1 and v2) as Go code that every
// receiving side runs before it does any work: it decides whether a package is acceptable,
// says why not in machine-readable reasons, builds the Ack, and converts between versions.
//
// # Version gate
//
// A consumer declares the versions it accepts (NewValidator(V1), NewValidator(V1, V2), ...).
// Every check reads the package's "schema" field first and stops there when it is empty
// (rule "required") or names a version the consumer did not declare (rule
// "version.accepted", with a message naming the version received and the accepted ones):
// exactly one reason on field "schema", and no other field is interpreted. A consumer must
// not half-read a version it never agreed to, and a sender must see at once that the version
// is the problem, not twenty field errors that follow from it. Only after the gate do the
// protovalidate rules of the matching message run (compiled once, in NewValidator).
//
// # JSON form
//
// Packages travel as protojson. CheckJSON takes the bytes as received and
//
//   - rejects more than MaxPackageBytes (64 KiB) before parsing ("size.max"): packages carry
//     references, not payloads, so a big package is a transcript or a tool dump that slipped
//     in, and a reader must bound what it reads;
//   - rejects empty input ("required") and anything that is not a JSON object ("json.syntax");
//   - peeks the top-level "schema" member and gates it;
//   - decodes with unknown members rejected ("json.unknown_field", field = the member's path,
//     e.g. "budget.usd_remaining"), so a renamed or misspelt field (v1's tools_tried in a v2
//     package) is an error instead of silently vanishing;
//   - validates, turning violations into reasons (Reasons): field paths use proto names and
//     list indexes ("artifacts[0].uri"), rules are protovalidate rule ids ("required",
//     "string.pattern", "tool_attempt.error_code").
//
// Both snake_case (proto) and lowerCamelCase names decode; the platform emits snake_case.
// The Ack copies job_id, stage, schema and trace.traceparent from the package (AckFor,
// AckForMessage, AckJSON), leaving out values that would break the Ack's own rules, so an
// Ack built for any input, even garbage, is itself a valid handoff.v1.Ack.
//
// # Conversion
//
// V1ToV2 and V2ToV1 support dual-write while consumers move to handoff.v2. v1 -> v2 needs the
// budget deadline v1 does not have; v2 -> v1 drops it. memory_refs "kind:id" strings split at
// the first ':' into MemoryRef{kind, id}; tools_tried and tool_attempts map one to one.
//
// # JSON Schema and protovalidate
//
// gen/jsonschema holds Draft 2020-12 JSON Schemas generated from the same proto, for
// validators outside Go (`handoff schema handoff.v1`). The contract tests check that both give
// the same verdict on every fixture and on every single-field removal from the valid
// fixtures. They cannot agree everywhere; these are the known differences (asserted by
// TestKnownDivergences, so a change to any of them is noticed):
//
// Rules only protovalidate enforces (CEL; JSON Schema has no way to say them), so a JSON
// Schema validator alone accepts packages that break them:
//
//   - tool_attempt.error_code: a successful attempt (ok) carries no error_code;
//   - evaluator.failures: a FAIL verdict needs at least one failure, a PASS verdict none;
//   - traceparent.nonzero: trace id and parent id must not be all zeros;
//   - ack.reasons: a rejected Ack needs at least one reason;
//   - ack.prior: a DUPLICATE Ack must carry the prior result.
//
// The valid fixtures are built so that removing any single field never trips one of these
// (tools_tried entries are all ok, the PASS evaluator has no failures), which is what lets
// the drop test demand the same verdict from both validators.
//
// Other differences, from the JSON Schema generator rather than from CEL:
//
//   - An int64 may be written as a JSON string; the generated string pattern allows a minus
//     sign, so {"usd_remaining_micros": "-5"} passes JSON Schema; protovalidate rejects it.
//   - The JSON Schema's required lists name snake_case members only, so a package that spells
//     a required field in lowerCamelCase ("jobId") fails JSON Schema and passes CheckJSON.
//   - string.uri is approximated by a regular expression in JSON Schema.
package contract
