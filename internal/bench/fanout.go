package bench

import (
	"context"
	"log/slog"

	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// FanoutPipeline is the name of figure J_fanout's pipeline: one parallel stage of three
// no-op branches and a no-op merge, no judge and no writeback: what a fan-out and its fan-in
// cost the rail beside figure J's five stages in a row.
const FanoutPipeline = "bench-fanout-3"

const fanoutPipelineYAML = `name: bench-fanout-3
description: three no-op branches in parallel and a merge, to measure a fan-out on the rail
max_hops: 10
max_revisions: 0
escalation: {route: bench}
tools: []
stages:
  - name: fan
    kind: parallel
    input: bench_in.v1
    branches:
      - {name: b1, outputs: [b1_out], stages: [{name: f1, input: bench_in.v1, output: {type: b1_out, schema_version: b1_out.v1}, criteria: [c1]}]}
      - {name: b2, outputs: [b2_out], stages: [{name: f2, input: bench_in.v1, output: {type: b2_out, schema_version: b2_out.v1}, criteria: [c2]}]}
      - {name: b3, outputs: [b3_out], stages: [{name: f3, input: bench_in.v1, output: {type: b3_out, schema_version: b3_out.v1}, criteria: [c3]}]}
  - {name: merge, kind: merge, output: {type: merged, schema_version: merged.v1}, criteria: [c4]}
`

// addFanout adds figure J_fanout's pipeline to pipes and a Noop agent for each of its
// stages to agents.
func addFanout(pipes map[string]*pipeline.Pipeline, agents []agentrunner.Agent) ([]agentrunner.Agent, error) {
	p, problems, err := pipeline.Parse(FanoutPipeline+".yaml", []byte(fanoutPipelineYAML))
	if err != nil {
		return nil, err
	}
	if pipeline.HasErrors(problems) {
		return nil, &pipeline.Error{File: FanoutPipeline + ".yaml", Problems: problems}
	}
	pipes[p.Name] = p
	for _, st := range p.Stages {
		for _, b := range st.Branches {
			for _, bs := range b.Stages {
				agents = append(agents, agentrunner.NewNoop(bs.AgentName()))
			}
		}
		if !st.IsParallel() {
			agents = append(agents, agentrunner.NewNoop(st.AgentName()))
		}
	}
	return agents, nil
}

// newFanoutRig is figure J's rig on store kind, running J_fanout's pipeline.
func newFanoutRig(ctx context.Context, kind, redisAddr, baseDir string, log *slog.Logger) (*jobsRig, error) {
	r, err := newJobsRig(ctx, kind, redisAddr, baseDir, log)
	if err != nil {
		return nil, err
	}
	r.pipeline = FanoutPipeline
	return r, nil
}
