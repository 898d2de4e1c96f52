package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"slices"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// The content of a job and of a submit request, as CreateRun compares them. Pure functions:
// both stores keep the digests these return and compare them in the write that creates a run.

// JobDigest is the digest of what makes a job the job it is, taken from the run as
// submitted (CreateRun's job): job_id, pipeline, goal, constraints (in order), its inputs
// (the artifacts it starts with, every field of each) and memory_refs. Not content: the
// budget (a repeat may bring its own), request_id, the trace, and everything the run gains
// later. Two submissions of one job_id with different digests are two different jobs
// claiming one id, which CreateRun refuses (ErrJobConflict).
//
// The encoding is this package's own (each field length-prefixed, lists counted), not
// protobuf's, whose deterministic output may change between library versions: a digest
// stored by one release must match the same content submitted to the next.
func JobDigest(j *handoffv1.Job) string {
	h := sha256.New()
	writeJob(h, "handoff.job.v1", j)
	return hex.EncodeToString(h.Sum(nil))
}

// RequestDigest is the digest of a submit request, taken from the run it created: the job's
// content (JobDigest) and the budget the run started with (money, revisions, hops; not the
// wallet id, which is the rail's). A request_id used again with a different digest is a
// different request (ErrRequestConflict); the same digest is its retry.
func RequestDigest(j *handoffv1.Job) string {
	h := sha256.New()
	writeJob(h, "handoff.request.v1", j)
	var b [8]byte
	w := j.GetWallet()
	binary.BigEndian.PutUint64(b[:], uint64(w.GetUsdRemainingMicros()))
	h.Write(b[:])
	binary.BigEndian.PutUint64(b[:], uint64(w.GetRevisionsRemaining()))
	h.Write(b[:])
	binary.BigEndian.PutUint64(b[:], uint64(w.GetHopsRemaining()))
	h.Write(b[:])
	return hex.EncodeToString(h.Sum(nil))
}

// SameIntake reports whether two runs were submitted with the same job_id, pipeline, goal,
// constraints and memory_refs: the content a run keeps unchanged for its whole life. It
// decides a request_id recorded before requests recorded their digest (what the earlier run
// still holds is all there is to compare).
func SameIntake(a, b *handoffv1.Job) bool {
	return a.GetJobId() == b.GetJobId() && a.GetPipeline() == b.GetPipeline() && a.GetGoal() == b.GetGoal() &&
		slices.Equal(a.GetConstraints(), b.GetConstraints()) && slices.Equal(a.GetMemoryRefs(), b.GetMemoryRefs())
}

func writeJob(h hash.Hash, domain string, j *handoffv1.Job) {
	writeStr(h, domain)
	writeStr(h, j.GetJobId())
	writeStr(h, j.GetPipeline())
	writeStr(h, j.GetGoal())
	writeList(h, j.GetConstraints())
	writeLen(h, len(j.GetArtifacts()))
	for _, a := range j.GetArtifacts() {
		for _, s := range []string{a.GetType(), a.GetSchemaVersion(), a.GetUri(), a.GetMediaType(), a.GetSha256(), a.GetProducedBy()} {
			writeStr(h, s)
		}
	}
	writeList(h, j.GetMemoryRefs())
}

func writeLen(h hash.Hash, n int) {
	var b [binary.MaxVarintLen64]byte
	h.Write(b[:binary.PutUvarint(b[:], uint64(n))])
}

func writeStr(h hash.Hash, s string) {
	writeLen(h, len(s))
	h.Write([]byte(s))
}

func writeList(h hash.Hash, l []string) {
	writeLen(h, len(l))
	for _, s := range l {
		writeStr(h, s)
	}
}
