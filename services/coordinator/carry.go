package coordinator

import (
	"slices"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// What a package carries from hop to hop: context is added to, never overwritten by a
// stage. Pure functions; the driver applies them to the run after each stage result.

// maxQuestions is the contract's cap on a package's open_questions: a package carries the
// most recent ones, the run keeps them all.
const maxQuestions = 32

// carryQuestions is the job's open questions after a stage: open with the stage's new
// questions added (each once) and only those it named in resolved removed, and only if its
// package carried them (a stage cannot close a question it never saw: the package carries
// the newest maxQuestions of open). A stage that says nothing about a question leaves it
// open: intake's "customer timezone unknown" is still open at the judge unless some stage
// resolved it by name.
func carryQuestions(open, added, resolved []string) []string {
	carried := lastN(open, maxQuestions)
	out := make([]string, 0, len(open)+len(added))
	for _, q := range append(slices.Clone(open), added...) {
		if (slices.Contains(resolved, q) && slices.Contains(carried, q)) || slices.Contains(out, q) {
			continue
		}
		out = append(out, q)
	}
	return out
}

// addRefs is the stages' memory refs after a stage added added: each ref once, and none
// already among the job's own (submitted) refs.
func addRefs(stageRefs, own, added []string) []string {
	out := slices.Clone(stageRefs)
	for _, r := range added {
		if !slices.Contains(out, r) && !slices.Contains(own, r) {
			out = append(out, r)
		}
	}
	return out
}

// memoryRefs is what a package carries: the job's own refs, then the ones stages added,
// the most recent within the contract's cap.
func memoryRefs(job *handoffv1.Job) []string {
	if len(job.GetStageMemoryRefs()) == 0 {
		return job.GetMemoryRefs()
	}
	return last(append(slices.Clone(job.GetMemoryRefs()), job.GetStageMemoryRefs()...))
}
