package bench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

// PackageBytes is the encoded size the benchmark package is padded to (proto.Size).
const PackageBytes = 2048

// EchoBytes is the payload of the bare hop (A) and the echo.
const EchoBytes = 1024

// template is a ~2 KB valid handoff.v1 package whose parts are shared, read-only, by every
// package made from it: only job id, trace and wallet differ per hop, the way the
// coordinator builds each hop's package from a run's state.
type template struct {
	stage         string
	goal          string
	constraints   []string
	artifacts     []*handoffv1.Artifact
	openQuestions []string
	toolsTried    []*handoffv1.ToolAttempt
	memoryRefs    []string
	nextHint      string
}

func sha(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }

// newTemplate builds the template for stage, padding next_hint so that a package with a
// 24-byte job id, a traceparent and a 24-byte wallet id encodes to PackageBytes.
func newTemplate(stage string) *template {
	t := &template{
		stage: stage,
		goal: "Draft an internal triage summary of the customer's refund question for the support lead; " +
			"do not send anything to the customer; cite the help center article for every claim or say no_match.",
		constraints:   []string{"no refund promises", "cite help center or no_match", "internal audience only", "keep under 300 words"},
		openQuestions: []string{"customer timezone unknown", "order id not confirmed by the customer"},
		toolsTried: []*handoffv1.ToolAttempt{
			{Name: "tickets.get", Ok: true, Stage: "intake"},
			{Name: "kb.search", Ok: false, ErrorCode: "timeout", Stage: "retrieve", Detail: "first attempt timed out after 5s"},
			{Name: "kb.search", Ok: true, Stage: "retrieve"},
		},
		memoryRefs: []string{"customer_id:cus_9", "order_id:ord_77812", "locale:en-GB"},
	}
	for _, a := range []struct{ typ, stage, media string }{
		{"raw_ticket", "submit", "application/json"}, {"intake", "intake", "application/json"}, {"chunks", "retrieve", "application/json"},
	} {
		t.artifacts = append(t.artifacts, &handoffv1.Artifact{
			Type: a.typ, SchemaVersion: a.typ + ".v1", MediaType: a.media, ProducedBy: a.stage,
			Uri:    fmt.Sprintf("file:///var/lib/handoff/artifacts/tkt_18422/%s-r0/%s.json", a.stage, a.typ),
			Sha256: sha(a.typ),
		})
	}
	probe := t.make("bench-0123456789abcdef-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "run_0123456789abcdef_0001")
	const filler = "cite the refund policy for the second claim and keep the summary to the facts the ticket states; "
	if pad := PackageBytes - proto.Size(probe) - 3; pad > 0 { // 3: next_hint's tag and length
		t.nextHint = strings.Repeat(filler, pad/len(filler)+1)[:min(pad, 1000)]
	}
	return t
}

// make returns a fresh package for one hop. The shared parts must not be modified.
func (t *template) make(jobID, traceparent, walletID string) *handoffv1.HandoffPackage {
	return &handoffv1.HandoffPackage{
		Schema:        contract.V1,
		JobId:         jobID,
		Stage:         t.stage,
		Goal:          t.goal,
		Constraints:   t.constraints,
		Artifacts:     t.artifacts,
		OpenQuestions: t.openQuestions,
		ToolsTried:    t.toolsTried,
		Budget:        &handoffv1.Budget{UsdRemainingMicros: 1_196_500, RevisionsRemaining: 2, HopsRemaining: 10, WalletId: walletID},
		MemoryRefs:    t.memoryRefs,
		Trace:         &handoffv1.Trace{Traceparent: traceparent},
		NextHint:      t.nextHint,
	}
}

// newTraceparent returns a sampled traceparent with non-zero ids drawn from r (nil: the
// global generator).
func newTraceparent(r *rand.Rand) string {
	u := rand.Uint64
	if r != nil {
		u = r.Uint64
	}
	hi, lo, span := u()|1, u(), u()|1
	return fmt.Sprintf("00-%016x%016x-%016x-01", hi, lo, span)
}
