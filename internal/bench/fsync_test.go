package bench

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// BenchmarkFsync is the unit a write transaction on bbolt waits for: one 4 KiB page written
// in place and fdatasync'ed, in the OS temp folder (where J_bolt's store lives). ns/op is one
// fsync's latency on this disk; J_bolt's floor is stated in it (bench/README.md, "J_bolt
// against Restate: the fsync floor").
func BenchmarkFsync(b *testing.B) {
	f, err := os.CreateTemp("", "handoff-fsync-*")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	page := make([]byte, 4096)
	if _, err := f.WriteAt(page, 0); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		page[0] = byte(i)
		if _, err := f.WriteAt(page, 0); err != nil {
			b.Fatal(err)
		}
		if err := fdatasync(f); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

// BenchmarkJobsInFlight is J's throughput burst: five-stage jobs with 32 in flight
// (`handoff bench`'s default), on bbolt (J_bolt) and on Redis (J_redis). ns/op is wall time
// per job, 1e9/ns-per-op its jobs/s; under `strace -f -c -e trace=fdatasync` the bolt one
// counts the fsyncs a job costs when writers share commits, and its CPU profile is the CPU a
// job costs at throughput.
func BenchmarkJobsInFlight(b *testing.B) {
	for _, kind := range []string{StoreBolt, StoreRedis} {
		b.Run(kind, func(b *testing.B) { loopInFlight(b, 1, 32, jobsRigFor(b, kind).job) })
	}
}

// BenchmarkJobTmpfs is BenchmarkJob/bolt with the store on /dev/shm, where fsync does
// nothing: NOT DURABLE, only to split J_bolt's serial latency into the disk's share (the
// difference) and everything else.
func BenchmarkJobTmpfs(b *testing.B) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		b.Skip("no /dev/shm")
	}
	r, err := newJobsRig(context.Background(), StoreBolt, DefaultRedisAddr, "/dev/shm", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.close)
	loop(b, r.job)
}
