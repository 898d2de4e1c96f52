package agentrunner_test

import (
	"context"
	"sync/atomic"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// switchable is a writeOne agent whose declared versions a test changes while it serves.
type switchable struct {
	name    string
	accepts atomic.Pointer[[]string]
}

func (s *switchable) Card() agentrunner.RoleCard {
	return agentrunner.RoleCard{Name: s.name, Accepts: *s.accepts.Load()}
}

func (s *switchable) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	return writeOne(ctx, in)
}
