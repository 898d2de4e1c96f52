package coordinator

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

// Consumers declare the versions they accept (AgentRunnerService.Describe), and the rail
// reads the declaration before it sends: each stage gets the newest version its agent
// declares (chooseVersion, rules.go), converted from the run's state. Declarations are kept
// for DescribeTTL, so a runner upgraded in place is sent the new version within that time; a
// runner that refuses a version it declared before (a downgrade) is described again at once
// and the hop resent in the version it declares now (agentHop).

// defaultDescribeTTL is how long a runner's declaration is trusted when Options.DescribeTTL
// is zero.
const defaultDescribeTTL = 5 * time.Second

// declaration is what one runner said in Describe.
type declaration struct {
	at     time.Time
	agents map[string][]string // nil: the runner has no Describe (v1 only)
}

// declarations caches Describe per runner address ("" = the default runner).
type declarations struct {
	mu   sync.Mutex
	ttl  time.Duration
	now  func() time.Time
	byRn map[string]declaration
}

// v1Only is what a runner that declares nothing accepts: the version every runner reads.
var v1Only = []string{contract.V1}

// accepts returns the versions agent on the runner at addr declares, asking the runner when
// its declaration is older than the TTL. A runner without Describe accepts v1 only; one
// that cannot be asked now is taken as v1 only for this hop and asked again on the next
// (its Deliver fails the same way and is retried).
func (d *declarations) accepts(ctx context.Context, addr, agent string, rn handoffv1.AgentRunnerServiceClient, timeout time.Duration) []string {
	dec, ok := d.declared(addr)
	if !ok {
		dec = d.describe(ctx, addr, rn, timeout)
	}
	return dec.accepts(agent)
}

// declared returns the declaration of the runner at addr when it is kept and within the
// TTL: what accepts answers from without asking the runner.
func (d *declarations) declared(addr string) (declaration, bool) {
	d.mu.Lock()
	dec, ok := d.byRn[addr]
	d.mu.Unlock()
	return dec, ok && d.now().Sub(dec.at) < d.ttl
}

// describe asks the runner at addr what it declares and keeps the answer. A runner that
// cannot be asked now declares nothing (v1 only) for this call, and nothing is kept.
func (d *declarations) describe(ctx context.Context, addr string, rn handoffv1.AgentRunnerServiceClient, timeout time.Duration) declaration {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := rn.Describe(cctx, &handoffv1.DescribeRequest{})
	cancel()
	var dec declaration
	switch {
	case err == nil:
		dec = declaration{at: d.now(), agents: map[string][]string{}}
		for _, a := range resp.GetAgents() {
			dec.agents[a.GetName()] = a.GetAccepts()
		}
	case status.Code(err) == codes.Unimplemented:
		dec = declaration{at: d.now()}
	default:
		return declaration{}
	}
	d.mu.Lock()
	d.byRn[addr] = dec
	d.mu.Unlock()
	return dec
}

// accepts is what the declaration says agent accepts: v1 only for an agent it does not name.
func (dec declaration) accepts(agent string) []string {
	if acc, ok := dec.agents[agent]; ok {
		return acc
	}
	return v1Only
}

// forget drops the runner's declaration, so the next hop asks again.
func (d *declarations) forget(addr string) {
	d.mu.Lock()
	delete(d.byRn, addr)
	d.mu.Unlock()
}

// deliverRequest is the request of a hop in version ver: pkg itself (v1), or pkg converted to
// v2 with the run's deadline. A run the conversion cannot carry (none has a deadline) goes
// as v1: chooseVersion only picks v2 for a run with a deadline.
func deliverRequest(pkg *handoffv1.HandoffPackage, ver string, job *handoffv1.Job) (*handoffv1.DeliverRequest, string) {
	if ver == contract.V2 {
		if p2, err := contract.V1ToV2(pkg, job.GetDeadline().AsTime()); err == nil {
			return &handoffv1.DeliverRequest{PackageV2: p2}, contract.V2
		}
	}
	return &handoffv1.DeliverRequest{Package: pkg}, contract.V1
}

// refusedVersion reports whether ack refuses the package's version (the runner no longer
// declares what it was sent).
func refusedVersion(ack *handoffv1.Ack) bool {
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
		return false
	}
	for _, r := range ack.GetReasons() {
		if r.GetField() == "schema" && r.GetRule() == contract.RuleVersionAccepted {
			return true
		}
	}
	return false
}
