package chaos

import (
	"fmt"
	"path/filepath"

	"google.golang.org/grpc"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
)

// layout is how the platform is deployed on a chaos run's store: one code path for the
// run (plan, proxy, sink, kills, checks), with the processes laid out per store.
//
//   - On Redis and Redis Cluster, as in production: the coordinator (two replicas), the
//     agent runner and the writeback, each its own binary and process on the shared
//     store; a kill SIGKILLs one service, and the other coordinator replica takes the
//     killed one's runs over.
//   - On bbolt, as `handoff up` runs: the three services in one process, since the
//     embedded store is one file that one process holds (an exclusive flock). The harness
//     runs `handoff up` (built with -tags crashpoints) as one supervised process, its
//     coordinator dialing the hop proxy for the agent runner and the writeback (up's
//     test-only --test-agentrunner-via and --test-writeback-via), so re-deliveries and the
//     mid-stage kill work as on Redis. Every kill SIGKILLs that process, all three
//     services at once, and the supervisor starts it again on the same file: the kinds
//     of kill (coordinator, agentrunner, writeback) name where it was killed (a
//     coordinator mid-job, the runner mid-stage after ACCEPTED, the writeback at its
//     crash points or after the sink applied), not what died. There are no Redis faults,
//     and the ledger target is the ledger in the bbolt file (entry and receipt in one
//     transaction), read once the process stopped. The restarted process takes its runs,
//     its stage claims and its writes' pending claims back at once: opening the file
//     releases the leases and claims a dead process left (store/bolt_reclaim.go).
type layout struct {
	name string
	// binaries are the commands built from cmd/<name>, one binary each.
	binaries []string
	// crashBin is the binary whose crash points the ledger target's kills need.
	crashBin string
	// oneProcess: every service in one process, so a kill stops them all.
	oneProcess bool
}

func layoutOf(store string) layout {
	if store == StoreBolt {
		return layout{name: "handoff up: coordinator, agentrunner and writeback in one process on one bbolt file",
			binaries: []string{"handoff"}, crashBin: "handoff", oneProcess: true}
	}
	return layout{name: "coordinator x2, agentrunner and writeback as separate processes on " + store,
		binaries: []string{"coordinator", "agentrunner", "writeback"}, crashBin: "writeback"}
}

// artifacts is the artifact folder the harness puts the jobs' inputs in: the one the
// services read (on bbolt, the one process's --data folder holds it).
func (l layout) artifacts(dir string) string {
	if l.oneProcess {
		return filepath.Join(dir, "data", "artifacts")
	}
	return filepath.Join(dir, "artifacts")
}

// processKinds are the kinds of kill that stop the one process of a oneProcess layout.
var processKinds = []string{kindCoordinator, kindRunner, kindWriteback}

// mkOneProcess makes the bbolt layout's one process: `handoff up` on dataDir, its three
// services on the given addresses, its coordinator dialing the hop proxy. Its timings are
// up's own (lease 1.5s, stage claim 3s renewed; its writes' pending claim, 2 min, is
// released when the restarted process opens the file), not the Redis layout's shortened
// ones: the run measures `handoff up` as shipped.
func (h *harness) mkOneProcess(bin, dataDir, logDir, runnerAddr, wbAddr, coordAddr, plDir, opToken string) error {
	p, err := newProc("handoff-up", "handoff-up", bin, coordAddr, filepath.Join(logDir, "handoff-up.log"), []string{"up",
		"--data", dataDir, "--coordinator-listen", coordAddr, "--agentrunner-listen", runnerAddr, "--writeback-listen", wbAddr,
		"--test-agentrunner-via", h.proxy.addr, "--test-writeback-via", h.proxy.addr,
		"--pipelines", plDir, "--operator-token", opToken, "--webhook-url", h.sink.url,
		"--web-listen", "", "--metrics-listen", ""}, h.say,
		// Its health is dialled again as the services dial each other (rpc.Reconnect):
		// with gRPC's default backoff (1 s, growing) the harness would see the restarted
		// process up a second or more after it is, and a run here takes seconds, so
		// planned kills came due while it looked down and were missed. The Redis layout
		// keeps the default, on which its fault plan's spacing and the figures measured
		// with it rest (a comparison at 100 jobs did not tell the two apart from the
		// run-to-run noise: coordinator time to resume p50 1.6-3.2 s either way).
		grpc.WithConnectParams(rpc.Reconnect))
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	h.procs = append(h.procs, p)
	h.coords, h.runner, h.writeback = []*proc{p}, p, p
	return nil
}

// mkServices makes the processes of the Redis layout: the agent runner, the writeback and
// two coordinator replicas dialing the hop proxy, each its own binary from bin.
func (h *harness) mkServices(bin, keyDir, storeURL, logDir, artDir, runnerAddr, wbAddr string, addr func(int) string, plDir, opToken string) error {
	common := []string{"--plaintext-loopback", "--token-public-keys", filepath.Join(keyDir, identity.PublicDir), "--store", storeURL}
	mk := func(name, kind, listen string, args ...string) error {
		own := []string{"--listen", listen, "--token-key-file", identity.KeyFile(keyDir, kind)}
		p, err := newProc(name, kind, filepath.Join(bin, kind), listen, filepath.Join(logDir, name+".log"),
			append(append(own, common...), args...), h.say)
		if err != nil {
			return err
		}
		h.procs = append(h.procs, p)
		switch kind {
		case "coordinator":
			h.coords = append(h.coords, p)
		case "agentrunner":
			h.runner = p
		case "writeback":
			h.writeback = p
		}
		return nil
	}
	if err := mk("agentrunner", "agentrunner", runnerAddr, "--artifacts", artDir, "--stage-timeout", stageTimeout.String()); err != nil {
		return err
	}
	if err := mk("writeback", "writeback", wbAddr, "--artifacts", artDir, "--webhook-url", h.sink.url,
		"--webhook-timeout", webhookTimeout.String(), "--pending-ttl", pendingTTL.String()); err != nil {
		return err
	}
	for i := range 2 {
		if err := mk(fmt.Sprintf("coordinator-%d", i+1), "coordinator", addr(2+i),
			"--agentrunner", h.proxy.addr, "--writeback", h.proxy.addr, "--pipelines", plDir,
			"--lease-ttl", h.cfg.LeaseTTL.String(), "--hop-retry-for", hopRetryFor.String(), "--hop-timeout", hopTimeout.String(),
			"--health-interval", "500ms", "--drain-timeout", "10s", "--operator-token", opToken); err != nil {
			return err
		}
	}
	return nil
}
