// Package bench measures what the platform costs per hop against what the same hop costs
// without it, in one process, with figures that share one setup between `handoff bench`
// and the Go benchmarks (go test -bench . ./internal/bench):
//
//	A     bare hop: a gRPC unary call over 127.0.0.1 TCP carrying 1 KiB whose handler does
//	      one Redis SET NX PX (the shape of an idempotency claim). No interceptors.
//	B     platform hop on Redis: a valid ~2 KB HandoffPackage sent by a client holding the
//	      coordinator's service token, through the full chain of the agent runner
//	      (assembled by internal/server as the binary does: otelgrpc, metrics, ack counter,
//	      logging, identity, trace, validate, role, idempotency, budget, recovery) to a Noop
//	      agent, until the ACCEPTED Ack and the COMPLETED StageResult are received, and then
//	      recorded the way the coordinator records a hop: one store.PutRun of the run.
//	      Store: store.OpenRedis with a unique key prefix, deleted at the end.
//	A2    B's honest floor: the runner's Deliver on a plain gRPC server, the handler doing
//	      only the durable work the hop keeps (the store's Admit, an ack and a result of
//	      B's shape, the Complete after sending), then the client's one PutRun.
//	C     the same on the embedded bbolt store (a file in the OS temp folder, fsync on every
//	      write transaction: the real configuration).
//	W_bolt  one bbolt write transaction in the same folder: what each of C's 3 writes costs.
//	C_tmpfs only on request: C with its bbolt file on /dev/shm, labelled NOT DURABLE.
//	R     a package missing its goal, sent the same way: REJECTED_SCHEMA Ack round trip;
//	      the agent must not be called.
//	R_floor  R's floor: the bare Deliver stream returning one message, its handler running V.
//	echo  bare gRPC unary echo of 1 KiB (no Redis).
//	V     contract.Validator.CheckV1 of the ~2 KB package, alone.
//	J     a 5-stage job of Noop agents through the coordinator (SubmitJob, then WatchJob
//	      until the run ends COMPLETED), on Redis and on bbolt; J_routes is J on Redis with
//	      a declared route chosen and checked at every stage; J_triage is the shipped
//	      support-triage pipeline (routes, its agents, the judge, one write) on bbolt.
//
// A, A2 and B also report their CPU per operation in the throughput bursts: the process's
// (getrusage) plus Redis's (INFO cpu deltas).
//
// `handoff replay` (Replay, StartReplayStack) sends generated valid, invalid and duplicate
// packages as hops and checks every Ack, write and trace.
//
// `handoff bench` runs every figure in round-robin short bursts (a serial burst for the
// latency percentiles, then a burst with Concurrency calls in flight for ops/s), so slow
// drift of the machine hits every figure alike.
package bench
