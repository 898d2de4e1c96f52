package identity

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Anyone is the policy value that lets any caller through, including one with no identity.
const Anyone = "*"

// AnyIdentity is the policy value that lets through every caller with a verified identity
// (any service of the trust domain, or an operator) and no anonymous one.
const AnyIdentity = "+"

// Policy maps a full gRPC method name ("/handoff.v1.WritebackService/Write") or a
// service wildcard ("/handoff.v1.WritebackService/*") to the services allowed to call it.
// An exact entry wins over its service's wildcard; an entry with no services lets nobody
// call; the value Anyone ("*") lets any caller through, identified or not; AnyIdentity ("+")
// any identified caller. A method the
// policy does not match is open only to the services of WithDefaultAllow (by default none).
//
// Health (/grpc.health.v1.Health/*) and reflection (/grpc.reflection.v1.ServerReflection/*,
// /grpc.reflection.v1alpha.ServerReflection/*) are always open and no policy closes them.
type Policy map[string][]string

// DefaultPolicy returns the platform's policy (a new map each call). Each line mirrors a
// rule of the design:
func DefaultPolicy() Policy {
	return Policy{
		// Writeback is the only writer to external systems and must run only after the
		// judge passed, which only the coordinator knows: no other caller, not even an
		// operator, may write. (The Kubernetes NetworkPolicy says the same one layer down.)
		"/handoff.v1.WritebackService/*": {"coordinator"},
		// The agent runner spends the job's wallet on model and tool calls: the coordinator
		// delivers packages, and an operator may run a manual hop or Check a package with
		// grpcurl. Agents and clients may not call it directly and skip the rail.
		"/handoff.v1.AgentRunnerService/*": {"coordinator", "operator"},
		// Check answers the ack a package would get and does no work and spends nothing,
		// so anyone may use it to test a package (grpcurl, CI of another team's agent).
		"/handoff.v1.AgentRunnerService/Check": {Anyone},
		// Submitting takes an identity too: a job_id is bound to its first submission's
		// content, so an anonymous caller could squat a predictable ticket id, or repeat
		// someone's request to be handed their run.
		"/handoff.v1.CoordinatorService/SubmitJob": {AnyIdentity},
		// A job's goal, constraints, memory refs and evaluator details are not for
		// everyone: reading them takes a verified identity, a service's or an operator's.
		"/handoff.v1.CoordinatorService/GetJob":   {AnyIdentity},
		"/handoff.v1.CoordinatorService/ListJobs": {AnyIdentity},
		"/handoff.v1.CoordinatorService/WatchJob": {AnyIdentity},
		// An explanation is a reading of the run's events, packages included: GetJob's rule.
		"/handoff.v1.CoordinatorService/ExplainJob": {AnyIdentity},
		// Escalations are decisions of people: only an operator (an operator token, or an
		// operator certificate under mTLS) lists and resolves them. No service identity
		// may, so a compromised runner cannot approve its own write. Any operator reads the
		// queue; only a resolver decides (a viewer account reads).
		"/handoff.v1.CoordinatorService/ListEscalations":   {OperatorService},
		"/handoff.v1.CoordinatorService/ResolveEscalation": {OperatorResolver},
		// Claiming an escalation is the first step of deciding it: a resolver's.
		"/handoff.v1.CoordinatorService/ClaimEscalation": {OperatorResolver},
	}
}

// openServices are always callable without identity: probes and `grpcurl list`.
var openServices = []string{
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}

// alwaysOpen reports whether fullMethod belongs to a service in openServices.
func alwaysOpen(fullMethod string) bool {
	svc, _, ok := splitMethod(fullMethod)
	return ok && slices.Contains(openServices, svc)
}

// splitMethod splits "/pkg.Service/Method" into its service and method.
func splitMethod(fullMethod string) (service, method string, ok bool) {
	rest, ok := strings.CutPrefix(fullMethod, "/")
	if !ok {
		return "", "", false
	}
	service, method, ok = strings.Cut(rest, "/")
	if !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return "", "", false
	}
	return service, method, true
}

// allowed returns the services allowed to call fullMethod, and whether the policy matched
// it at all.
func (p Policy) allowed(fullMethod string) ([]string, bool) {
	if a, ok := p[fullMethod]; ok {
		return a, true
	}
	if svc, _, ok := splitMethod(fullMethod); ok {
		if a, ok := p["/"+svc+"/*"]; ok {
			return a, true
		}
	}
	return nil, false
}

// Validate checks every key is "/pkg.Service/Method" or "/pkg.Service/*" and every value
// is a service name or "*". The interceptor constructors panic on an invalid policy; call
// Validate first on a policy read from configuration.
func (p Policy) Validate() error {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, _, ok := splitMethod(k); !ok {
			return fmt.Errorf("identity: policy key %q: want /pkg.Service/Method or /pkg.Service/*", k)
		}
		if err := checkServices(p[k]); err != nil {
			return fmt.Errorf("identity: policy %s: %w", k, err)
		}
	}
	return nil
}

func checkServices(services []string) error {
	for _, s := range services {
		if svc, role, ok := strings.Cut(s, ":"); ok && validService(svc) && (role == RoleViewer || role == RoleResolver) {
			continue
		}
		if s != Anyone && s != AnyIdentity && !validService(s) {
			return fmt.Errorf("%q is neither a service name nor %q or %q", s, Anyone, AnyIdentity)
		}
	}
	return nil
}

func (p Policy) clone() Policy {
	out := make(Policy, len(p))
	for k, v := range p {
		out[k] = slices.Clone(v)
	}
	return out
}
