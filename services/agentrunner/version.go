package agentrunner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
)

// Rule ids of the version gate.
const (
	RulePackageOne     = validate.RulePackageOne     // both package and package_v2 set
	RuleBudgetDeadline = contract.RuleBudgetDeadline // the package's budget.deadline has passed
	RuleConvert        = "version.convert"           // a v2 package the runner cannot read as v1
)

// The version gate is the chain's first step (before validate): a consumer declares the
// versions it accepts, and must not read a package of any other version. It
//
//   - answers a package of a version the addressed agent does not declare (its RoleCard's
//     Accepts, else the runner's Options.Validator) with REJECTED_SCHEMA naming the version
//     (field "schema", rule "version.accepted");
//   - for a handoff.v2 package (package_v2): checks it against v2's rules (REJECTED_SCHEMA),
//     checks budget.deadline against the clock (REJECTED_BUDGET, field and rule
//     "budget.deadline"), then hands the rest of the chain its v1 view (contract.V2ToV1)
//     in package, so role, stage de-duplication and the wallet work alike for both versions
//     and a v1 and a v2 delivery of one stage are one completion. The agent gets the v2
//     package as it came (Input.V2), and the Acks answer as handoff.v2.

// accepts returns the versions the agent addressed by name declares.
func (s *Server) accepts(name string) []string {
	if a, ok := s.agents[name]; ok {
		if acc := a.Card().Accepts; len(acc) > 0 {
			return acc
		}
	}
	return s.v.Accepts()
}

// versioned is what Deliver and Check requests have in common for the gate.
type versioned interface {
	proto.Message
	GetPackage() *handoffv1.HandoffPackage
	GetPackageV2() *handoffv2.HandoffPackage
	GetAgent() string
}

// gateVersion returns the Ack refusing req, or nil; for an accepted v2 request it returns the
// v2 package and the v1 view the rest of the chain reads.
func (s *Server) gateVersion(req versioned) (*handoffv1.Ack, *handoffv2.HandoffPackage, *handoffv1.HandoffPackage) {
	p1, p2 := req.GetPackage(), req.GetPackageV2()
	stage := p1.GetStage()
	if p2 != nil {
		stage = p2.GetStage()
	}
	name := req.GetAgent()
	if name == "" {
		name = stage
	}
	acc := s.accepts(name)
	switch {
	case p1 != nil && p2 != nil:
		return contract.AckForMessage(p2, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, &handoffv1.Reason{
			Rule: RulePackageOne, Message: "the request carries both a handoff.v1 package and a handoff.v2 package_v2; send exactly one",
		}), nil, nil
	case p1 != nil:
		if sc := p1.GetSchema(); sc != "" && !slices.Contains(acc, sc) {
			return contract.AckFor(p1, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, contract.VersionReason(sc, acc)), nil, nil
		}
		return nil, nil, nil
	case p2 == nil:
		return nil, nil, nil // no package: validate answers it
	}
	if !slices.Contains(acc, contract.V2) {
		return contract.AckForMessage(p2, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, contract.VersionReason(contract.V2, acc)), nil, nil
	}
	if r := s.all.CheckV2(p2); len(r) > 0 {
		return contract.AckForMessage(p2, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, r...), nil, nil
	}
	if dl := p2.GetBudget().GetDeadline().AsTime(); !s.now().Before(dl) {
		return contract.AckForMessage(p2, handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, &handoffv1.Reason{
			Field: "budget.deadline", Rule: RuleBudgetDeadline,
			Message: fmt.Sprintf("the job's deadline %s has passed", dl.UTC().Format(time.RFC3339)),
		}), nil, nil
	}
	v1, err := contract.V2ToV1(p2)
	if err != nil {
		return contract.AckForMessage(p2, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, &handoffv1.Reason{
			Rule: RuleConvert, Message: clip(err.Error(), 500),
		}), nil, nil
	}
	return nil, p2, v1
}

type v2Key struct{}

// v2From returns the handoff.v2 package this call received, if it received one.
func v2From(ctx context.Context) *handoffv2.HandoffPackage {
	p, _ := ctx.Value(v2Key{}).(*handoffv2.HandoffPackage)
	return p
}

// asV2 marks an Ack as the answer to a handoff.v2 package (the chain built it for the v1
// view). The Ack is copied: a stored or shared one is not changed.
func asV2(ack *handoffv1.Ack) *handoffv1.Ack {
	if ack == nil || ack.GetSchema() == contract.V2 {
		return ack
	}
	a := proto.Clone(ack).(*handoffv1.Ack)
	a.Schema = contract.V2
	return a
}

// versionUnary is the version gate of Check.
func (s *Server) versionUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != handoffv1.AgentRunnerService_Check_FullMethodName {
		return handler(ctx, req)
	}
	r, ok := req.(*handoffv1.CheckRequest)
	if !ok {
		return nil, status.Errorf(codes.Internal, "agentrunner: %s: request is %T", info.FullMethod, req)
	}
	ack, p2, v1 := s.gateVersion(r)
	if ack != nil {
		s.logAck(ctx, ack, "check")
		return &handoffv1.CheckResponse{Ack: ack}, nil
	}
	if p2 == nil {
		return handler(ctx, req)
	}
	r = proto.CloneOf(r)
	r.Package, r.PackageV2 = v1, nil
	resp, err := handler(context.WithValue(ctx, v2Key{}, p2), r)
	if cr, ok := resp.(*handoffv1.CheckResponse); ok && err == nil {
		resp = &handoffv1.CheckResponse{Ack: asV2(cr.GetAck())}
	}
	return resp, err
}

// versionStream is the version gate of Deliver.
func (s *Server) versionStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != handoffv1.AgentRunnerService_Deliver_FullMethodName {
		return handler(srv, ss)
	}
	m, err := hop.ReceiveRequest(ss, &handoffv1.DeliverRequest{}, info.FullMethod)
	if err != nil {
		return err
	}
	req := m.(*handoffv1.DeliverRequest)
	ack, p2, v1 := s.gateVersion(req)
	if ack != nil {
		s.logAck(ss.Context(), ack, "deliver")
		return sendAck(ss, ack)
	}
	if p2 == nil {
		return handler(srv, hop.NewReplayStream(ss, req, "agentrunner version gate"))
	}
	req = proto.CloneOf(req)
	req.Package, req.PackageV2 = v1, nil
	return handler(srv, &v2Stream{ReplayStream: hop.NewReplayStream(ss, req, "agentrunner version gate"), p2: p2})
}

// v2Stream is a Deliver stream that received a handoff.v2 package: the handler finds it in
// the context, and every Ack sent says handoff.v2.
type v2Stream struct {
	*hop.ReplayStream
	p2 *handoffv2.HandoffPackage
}

func (s *v2Stream) Context() context.Context {
	return context.WithValue(s.ReplayStream.Context(), v2Key{}, s.p2)
}

func (s *v2Stream) SendMsg(m any) error {
	if r, ok := m.(*handoffv1.DeliverResponse); ok && r.GetAck() != nil {
		m = &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: asV2(r.GetAck())}}
	}
	return s.ReplayStream.SendMsg(m)
}

// Describe answers what each agent declares: its name, the versions it accepts and its
// tools.
func (s *Server) Describe(ctx context.Context, _ *handoffv1.DescribeRequest) (*handoffv1.DescribeResponse, error) {
	out := &handoffv1.DescribeResponse{}
	for _, n := range slices.Sorted(maps.Keys(s.agents)) {
		c := s.agents[n].Card()
		out.Agents = append(out.Agents, &handoffv1.AgentDescription{Name: n, Accepts: s.accepts(n), Tools: slices.Clone(c.Tools)})
	}
	return out, nil
}
