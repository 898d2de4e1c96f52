package bench

import (
	"context"
	"testing"

	"github.com/handoffhq/handoff/internal/contract"
)

// The Go benchmarks run the same operations on the same rigs as `handoff bench`, one call
// at a time (ns/op is the serial latency). Figures that need Redis skip when it does not
// answer at DefaultRedisAddr.

func needRedis(b *testing.B) {
	b.Helper()
	if err := RedisReachable(context.Background(), DefaultRedisAddr); err != nil {
		b.Skip(err)
	}
}

func loop(b *testing.B, op func(context.Context, int) error) {
	b.Helper()
	ctx := context.Background()
	for range 10 { // warm-up, as Run does
		if err := op(ctx, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := op(ctx, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// loopInFlight is loop with conc calls in flight (RunN): warm operations first, untimed.
func loopInFlight(b *testing.B, warm, conc int, op func(context.Context, int) error) {
	b.Helper()
	ctx := context.Background()
	if _, _, err := RunN(ctx, warm, conc, op); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if _, _, err := RunN(ctx, b.N, conc, op); err != nil {
		b.Fatal(err)
	}
}

// jobsRigFor is figure J's rig on kind (skipped without Redis for StoreRedis).
func jobsRigFor(b *testing.B, kind string) *jobsRig {
	b.Helper()
	if kind == StoreRedis {
		needRedis(b)
	}
	r, err := newJobsRig(context.Background(), kind, DefaultRedisAddr, "", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	return r
}

func bareRigFor(b *testing.B, redisAddr string) *bareRig {
	b.Helper()
	r, err := newBareRig(context.Background(), redisAddr, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	return r
}

func hopRigFor(b *testing.B, kind string) *hopRig { return hopRigN(b, kind, 1) }

func hopRigN(b *testing.B, kind string, workers int) *hopRig {
	b.Helper()
	r, err := newHopRig(context.Background(), hopConfig{Store: kind, RedisAddr: DefaultRedisAddr, Workers: workers})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	return r
}

// BenchmarkBareHop is figure A.
func BenchmarkBareHop(b *testing.B) {
	needRedis(b)
	loop(b, bareRigFor(b, DefaultRedisAddr).hop)
}

// BenchmarkEcho is figure echo.
func BenchmarkEcho(b *testing.B) { loop(b, bareRigFor(b, "").echo) }

// BenchmarkPlatformHopRedis is figure B.
func BenchmarkPlatformHopRedis(b *testing.B) {
	needRedis(b)
	loop(b, hopRigFor(b, StoreRedis).hop)
}

// BenchmarkPlatformHopBolt is figure C.
func BenchmarkPlatformHopBolt(b *testing.B) { loop(b, hopRigFor(b, StoreBolt).hop) }

// BenchmarkRejected is figure R; it fails if the agent ran.
func BenchmarkRejected(b *testing.B) {
	r := hopRigFor(b, StoreBolt)
	loop(b, r.rejected)
	if n := r.agent.Calls(); n != 0 {
		b.Fatalf("the agent ran %d times for rejected packages", n)
	}
}

// BenchmarkValidate is figure V.
func BenchmarkValidate(b *testing.B) {
	v, err := contract.NewValidator()
	if err != nil {
		b.Fatal(err)
	}
	p := newTemplate(benchStage).make("bench-0123456789abcdef-01", newTraceparent(nil), "run_0123456789abcdef_0001")
	loop(b, func(context.Context, int) error {
		if rs := v.CheckV1(p); len(rs) > 0 {
			b.Fatal(rs)
		}
		return nil
	})
}

// BenchmarkJob is figure J, one job at a time, on each store.
func BenchmarkJob(b *testing.B) {
	for _, kind := range []string{StoreBolt, StoreRedis} {
		b.Run(kind, func(b *testing.B) { loop(b, jobsRigFor(b, kind).job) })
	}
}

func floorRigFor(b *testing.B, redisAddr string) *floorRig { return floorRigN(b, redisAddr, 1) }

func floorRigN(b *testing.B, redisAddr string, workers int) *floorRig {
	b.Helper()
	v, err := contract.NewValidator()
	if err != nil {
		b.Fatal(err)
	}
	var shape hopShape
	if redisAddr != "" {
		if shape, err = hopRigFor(b, StoreRedis).captureShape(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	r, err := newFloorRig(context.Background(), redisAddr, workers, v, shape)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	return r
}

// BenchmarkFloorHop is figure A2.
func BenchmarkFloorHop(b *testing.B) {
	needRedis(b)
	loop(b, floorRigFor(b, DefaultRedisAddr).hop)
}

// BenchmarkRejectedFloor is figure R_floor.
func BenchmarkRejectedFloor(b *testing.B) { loop(b, floorRigFor(b, "").rejected) }

// BenchmarkJobRoutes is figure J_routes (on bbolt when Redis does not answer).
func BenchmarkJobRoutes(b *testing.B) {
	kind := StoreRedis
	if RedisReachable(context.Background(), DefaultRedisAddr) != nil {
		kind = StoreBolt
	}
	r, err := newJobsRigFor(context.Background(), RoutesPipeline, kind, DefaultRedisAddr, "", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	loop(b, r.job)
}

// BenchmarkJobTriage is figure J_triage.
func BenchmarkJobTriage(b *testing.B) {
	r, err := newTriageRig(context.Background(), "", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	loop(b, r.job)
}

// BenchmarkHopsInFlight is the throughput burst of A2, B, R and R_floor: 32 calls in flight
// (`handoff bench`'s default), each worker on its own wallet and run. ns/op is wall time
// per call; its CPU profile is the CPU a call costs at throughput, which is what the
// throughput and CPU-per-hop ratios measure (a serial profile is mostly wake-ups).
func BenchmarkHopsInFlight(b *testing.B) {
	const inFlight = 32
	for _, f := range []struct {
		name  string
		redis bool
		op    func(b *testing.B) func(context.Context, int) error
	}{
		{"A2", true, func(b *testing.B) func(context.Context, int) error {
			return floorRigN(b, DefaultRedisAddr, inFlight).hop
		}},
		{"B", true, func(b *testing.B) func(context.Context, int) error { return hopRigN(b, StoreRedis, inFlight).hop }},
		{"R_floor", false, func(b *testing.B) func(context.Context, int) error { return floorRigN(b, "", inFlight).rejected }},
		{"R", false, func(b *testing.B) func(context.Context, int) error { return hopRigN(b, StoreBolt, inFlight).rejected }},
	} {
		b.Run(f.name, func(b *testing.B) {
			if f.redis {
				needRedis(b)
			}
			loopInFlight(b, 2*inFlight, inFlight, f.op(b))
		})
	}
}
