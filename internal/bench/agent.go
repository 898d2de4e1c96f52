package bench

import (
	"context"
	"sync"
	"sync/atomic"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// CountingAgent wraps an agent and counts its runs, in total and per job id, so a
// benchmark or a replay can prove that no rejected package reached an agent.
type CountingAgent struct {
	agentrunner.Agent

	calls atomic.Int64
	mu    sync.Mutex
	byJob map[string]int
}

// NewCountingAgent wraps a.
func NewCountingAgent(a agentrunner.Agent) *CountingAgent {
	return &CountingAgent{Agent: a, byJob: map[string]int{}}
}

// Run counts the call, then runs the wrapped agent.
func (c *CountingAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	c.calls.Add(1)
	c.mu.Lock()
	c.byJob[in.Package.GetJobId()]++
	c.mu.Unlock()
	return c.Agent.Run(ctx, in)
}

// Calls is the number of runs so far.
func (c *CountingAgent) Calls() int64 { return c.calls.Load() }

// CallsFor is the number of runs for one job id.
func (c *CountingAgent) CallsFor(jobID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byJob[jobID]
}
