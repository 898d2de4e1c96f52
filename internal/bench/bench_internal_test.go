package bench

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

func TestPackageIsValidAndTwoKB(t *testing.T) {
	v, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	p := newTemplate(benchStage).make("bench-0123456789abcdef-01", newTraceparent(nil), "run_0123456789abcdef_0001")
	if rs := v.CheckV1(p); len(rs) > 0 {
		t.Fatalf("benchmark package is invalid: %v", rs)
	}
	if n := proto.Size(p); n < PackageBytes-64 || n > PackageBytes+64 {
		t.Fatalf("package is %d bytes, want ~%d", n, PackageBytes)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	if p50, p99 := quantiles(s); p50 != 50 || p99 != 99 {
		t.Fatalf("p50 %d p99 %d, want 50 and 99", p50, p99)
	}
	if percentile(nil, 0.5) != 0 || percentile([]time.Duration{7}, 0.99) != 7 {
		t.Fatal("edge cases")
	}
}

// TestRunJobs is the API another module uses to run figure J beside a peer.
func TestRunJobs(t *testing.T) {
	res, err := RunJobs(context.Background(), JobsConfig{N: 4, Concurrency: 2, Store: StoreBolt})
	if err != nil {
		t.Fatal(err)
	}
	if res.P50 <= 0 || res.P99 < res.P50 || res.JobsPerSec <= 0 {
		t.Fatalf("RunJobs = %+v", res)
	}
	// A five-stage job through three services costs far more than a scheduler tick of CPU,
	// and no job costs a second of it.
	if res.CPU < 100*time.Microsecond || res.CPU > time.Second {
		t.Errorf("CPU per job %v, want the jobs' own (well over 100 µs, under 1 s)", res.CPU)
	}
	if res.CPURedis != 0 {
		t.Errorf("J on bbolt: Redis CPU per job %v, want none", res.CPURedis)
	}
	if _, err := RunJobs(context.Background(), JobsConfig{N: 1, Store: "etcd"}); err == nil {
		t.Fatal("an unknown store must be an error")
	}
}

// TestRunJobsRedis: on Redis the CPU per job holds the Redis server's share, which every job's
// scripts and commands cost, besides the process's.
func TestRunJobsRedis(t *testing.T) {
	res, err := RunJobs(context.Background(), JobsConfig{N: 4, Concurrency: 2, Store: StoreRedis, RedisAddr: testRedis(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.CPURedis <= 0 || res.CPU < res.CPURedis+100*time.Microsecond || res.CPU > time.Second {
		t.Errorf("CPU per job %v, Redis's %v; want Redis's > 0 and the process's well over 100 µs besides", res.CPU, res.CPURedis)
	}
}

// TestFanoutRig: figure J_fanout's job completes: its three branches and its merge ran, one
// hop each.
func TestFanoutRig(t *testing.T) {
	ctx := context.Background()
	r, err := newFanoutRig(ctx, StoreBolt, "", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for i := range 3 {
		if err := r.job(ctx, i); err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	resp, err := r.client.ListJobs(ctx, &handoffv1.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range resp.GetJobs() {
		if j.GetPipeline() != FanoutPipeline || len(j.GetBranches()) != 3 || j.GetHops() != 4 {
			t.Errorf("run %s: pipeline %s, %d branches, %d hops; want %s, 3 branches, 4 hops", j.GetRunId(), j.GetPipeline(), len(j.GetBranches()), j.GetHops(), FanoutPipeline)
		}
	}
}
