package bench

import (
	"context"
	"fmt"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// RoutesPipeline is figure J_routes' pipeline: J's five no-op stages, each declaring two
// routes (on to the next stage, or to a person), so every hop carries its stage's routes to
// the runner, the agent answers with one, and the rail checks it against the declaration
// before it moves the job.
const RoutesPipeline = "bench-routes-5"

func routesPipelineYAML() string {
	y := "name: " + RoutesPipeline + `
description: five no-op stages that each choose a declared route, to measure what routing costs the rail
max_hops: 10
max_revisions: 0
escalation: {route: bench}
tools: []
stages:
`
	in := "bench_in.v1"
	for i := 1; i <= 5; i++ {
		next := fmt.Sprintf("s%d", i+1)
		if i == 5 {
			next = "end"
		}
		y += fmt.Sprintf(`  - name: s%d
    input: %s
    output: {type: s%d_out, schema_version: s%d_out.v1}
    tools: []
    criteria: [c%d]
    routes:
      - {name: onward, description: "The work is done; hand it on.", to: %s}
      - {name: unclear, description: "A person must look at it.", to: escalate}
`, i, in, i, i, i, next)
		in = fmt.Sprintf("s%d_out.v1", i)
	}
	return y
}

// routingAgent is a Noop that answers with the first route its stage declares.
type routingAgent struct{ *agentrunner.Noop }

func (a routingAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	res, err := a.Noop.Run(ctx, in)
	if err != nil {
		return nil, err
	}
	if len(in.Routes) == 0 {
		return nil, fmt.Errorf("bench: stage %s was sent without its routes", in.Package.GetStage())
	}
	res.Route = &handoffv1.RouteChoice{Name: in.Routes[0].GetName(), Reason: "no-op stage: always onward"}
	return res, nil
}

func routesPipelines() (map[string]*pipeline.Pipeline, []agentrunner.Agent, error) {
	p, problems, err := pipeline.Parse(RoutesPipeline+".yaml", []byte(routesPipelineYAML()))
	if err != nil {
		return nil, nil, err
	}
	if pipeline.HasErrors(problems) {
		return nil, nil, &pipeline.Error{File: RoutesPipeline + ".yaml", Problems: problems}
	}
	var agents []agentrunner.Agent
	for _, st := range p.Stages {
		agents = append(agents, routingAgent{agentrunner.NewNoop(st.AgentName())})
	}
	return map[string]*pipeline.Pipeline{p.Name: p}, agents, nil
}
