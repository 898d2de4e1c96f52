package server

import "time"

// Defaults of the settings that more than one binary (or `handoff up`) has, declared once.
const (
	// Listen addresses: each service's --listen, the coordinator's --agentrunner and
	// --writeback, and `handoff up`.
	CoordinatorAddr = "127.0.0.1:50051"
	RunnerAddr      = "127.0.0.1:50052"
	WritebackAddr   = "127.0.0.1:50053"
	// Artifacts is the artifact folder the agent runner and the writeback share.
	Artifacts = "./handoff-data/artifacts"
	// DefaultStoreWait is how long a binary keeps trying a Redis store that does not
	// answer yet at start-up (--store-wait).
	DefaultStoreWait = 60 * time.Second
	// DefaultHealthInterval is how often health pings the store.
	DefaultHealthInterval = time.Second
	// DefaultStopTimeout bounds a graceful stop: calls in flight after it are cut.
	DefaultStopTimeout = 30 * time.Second
)
