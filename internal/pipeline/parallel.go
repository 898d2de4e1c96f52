package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Fan-out, fan-in and sub-jobs.
//
// A stage of kind parallel starts its branches from one package and runs them at once.
// Each branch is a short chain of agent stages and declares its partition: the output
// artifact types and the tools it owns. The partitions are hard (lint rules partition-*):
// two branches share no output type, no write tool and no writer, and no branch writes
// externally (branch-writes): the one writer stays the pipeline's writeback stage.
//
// The stage right after a parallel stage is its merge (kind merge): it receives every
// branch's result keyed by branch and runs once per set of branch results. A merge with
// judge: true is also the pipeline's judge (its verdict gates the writeback).
//
// A stage of kind subjob starts a nested run of another declared pipeline on the parent's
// wallet and trace, with its own hop cap; only its final artifact returns to the stage.

// More stage kinds.
const (
	// KindParallel runs Branches concurrently from one package.
	KindParallel = "parallel"
	// KindMerge receives every branch result of the parallel stage before it.
	KindMerge = "merge"
	// KindSubJob runs SubJob.Pipeline as a nested run and returns its final artifact.
	KindSubJob = "subjob"
)

// Stage.OnBranchFailure values: what a parallel stage does when a branch fails or times out.
const (
	// BranchFailEscalate hands the job to a person (the default).
	BranchFailEscalate = "escalate"
	// BranchFailFail ends the job FAILED.
	BranchFailFail = "fail"
	// BranchFailContinue merges the branches that completed, without the failed ones.
	BranchFailContinue = "continue_without"
)

// Pipeline.OnWalletEmpty values: what branches still running do when the wallet empties.
const (
	// WalletEmptyFinish lets every hop already in flight finish (its result is kept), then
	// starts no new hop and escalates WALLET_EMPTY (the default).
	WalletEmptyFinish = "finish_in_flight"
	// WalletEmptyStop cancels the hops in flight at once and escalates WALLET_EMPTY.
	WalletEmptyStop = "stop"
)

// SubJob.Stop values: when a nested run is done.
const (
	// StopJudged: the sub-run stops once its judge passed its output, before any writeback
	// stage (a sub-job never writes externally; the parent's writeback does).
	StopJudged = "judged"
	// StopCompleted: the sub-run runs to its end (for a pipeline that writes nothing).
	StopCompleted = "completed"
)

// DefaultBranchTimeout bounds a branch when its parallel stage sets no branch_timeout.
const DefaultBranchTimeout = 2 * time.Minute

// maxChain is the longest chain a branch may be.
const maxChain = 4

// Branch is one branch of a parallel stage.
type Branch struct {
	Name string
	// Outputs are the artifact types the branch owns (its partition).
	Outputs []string
	// Tools are the catalogue tools the branch owns.
	Tools []string
	// Stages run in order within the branch (agent stages).
	Stages []Stage
	// Line is the branch's line in Source.
	Line int
}

// SubJob is a subjob stage's self-contained task.
type SubJob struct {
	// Pipeline is the declared pipeline the nested run goes through.
	Pipeline string
	// Objective is the nested run's goal.
	Objective string
	// Output is the schema version of the artifact that returns to the parent.
	Output string
	// Tools are the tools the nested run may hold: every stage of it holds only these.
	Tools []string
	// Stop is StopJudged or StopCompleted.
	Stop string
	// MaxHops is the nested run's own hop cap.
	MaxHops int
}

var (
	branchFields = []string{"name", "outputs", "tools", "stages"}
	subjobFields = []string{"pipeline", "objective", "output", "tools", "stop", "max_hops"}
)

// fanoutField decodes the stage fields of parallel, merge and subjob stages.
func (d *decoder) fanoutField(s *Stage, path, what, key string, v *yaml.Node) {
	f := path + "." + key
	switch key {
	case "on_branch_failure":
		s.OnBranchFailure = d.str(v, f, what+": on_branch_failure")
	case "branch_timeout":
		raw := d.str(v, f, what+": branch_timeout")
		if raw == "" {
			return
		}
		dur, err := time.ParseDuration(raw)
		if err != nil || dur <= 0 {
			d.typeProblem(v, f, fmt.Sprintf("%s: branch_timeout %q is not a positive duration (e.g. 30s, 2m)", what, raw))
			return
		}
		s.BranchTimeout = dur
	case "judge":
		rv := resolve(v)
		var b bool
		if rv.Kind != yaml.ScalarNode || rv.ShortTag() != "!!bool" || rv.Decode(&b) != nil {
			d.typeProblem(v, f, fmt.Sprintf("%s: judge must be true or false, not %s", what, describe(rv)))
			return
		}
		s.Judge = b
	case "branches":
		d.sequence(v, f, what+": branches", func(j int, item *yaml.Node) {
			bp := fmt.Sprintf("%s[%d]", f, j)
			b := Branch{Line: pos(item).line}
			bwhat := fmt.Sprintf("%s: branch %d", what, j+1)
			d.mapping(item, bp, bwhat, branchFields, func(key string, v *yaml.Node) {
				switch key {
				case "name":
					b.Name = d.str(v, bp+".name", bwhat+": name")
				case "outputs":
					b.Outputs = d.strings(v, bp+".outputs", bwhat+": outputs", "[policy]")
				case "tools":
					b.Tools = d.strings(v, bp+".tools", bwhat+": tools", "[policy.search]")
				case "stages":
					d.sequence(v, bp+".stages", bwhat+": stages", func(k int, item *yaml.Node) {
						b.Stages = append(b.Stages, d.stageAt(fmt.Sprintf("%s.stages[%d]", bp, k), k, item))
					})
				}
			})
			s.Branches = append(s.Branches, b)
		})
	case "subjob":
		if isNull(v) {
			return
		}
		sj := &SubJob{}
		d.mapping(v, f, what+": subjob", subjobFields, func(key string, v *yaml.Node) {
			g := f + "." + key
			switch key {
			case "pipeline":
				sj.Pipeline = d.str(v, g, what+": subjob.pipeline")
			case "objective":
				sj.Objective = d.str(v, g, what+": subjob.objective")
			case "output":
				sj.Output = d.str(v, g, what+": subjob.output")
			case "tools":
				sj.Tools = d.strings(v, g, what+": subjob.tools", "[kb.search]")
			case "stop":
				sj.Stop = d.str(v, g, what+": subjob.stop")
			case "max_hops":
				sj.MaxHops = d.int(v, g, what+": subjob.max_hops")
			}
		})
		s.SubJob = sj
	}
}

// IsParallel reports whether the stage is a parallel group.
func (s *Stage) IsParallel() bool { return s.Kind == KindParallel }

// IsMerge reports whether the stage is a merge.
func (s *Stage) IsMerge() bool { return s.Kind == KindMerge }

// IsSubJob reports whether the stage runs a nested pipeline.
func (s *Stage) IsSubJob() bool { return s.Kind == KindSubJob }

// Judges reports whether the stage returns a verdict: a judge, or a merge that is one.
func (s *Stage) Judges() bool { return s.IsJudge() || (s.IsMerge() && s.Judge) }

// BranchFailure is the stage's on_branch_failure, BranchFailEscalate when unset.
func (s *Stage) BranchFailure() string {
	if s.OnBranchFailure == "" {
		return BranchFailEscalate
	}
	return s.OnBranchFailure
}

// Timeout is the stage's branch_timeout, DefaultBranchTimeout when unset.
func (s *Stage) Timeout() time.Duration {
	if s.BranchTimeout <= 0 {
		return DefaultBranchTimeout
	}
	return s.BranchTimeout
}

// Branch returns the parallel stage's branch with the given name.
func (s *Stage) Branch(name string) (*Branch, bool) {
	for i := range s.Branches {
		if s.Branches[i].Name == name {
			return &s.Branches[i], true
		}
	}
	return nil, false
}

// WalletEmpty is the pipeline's on_wallet_empty, WalletEmptyFinish when unset.
func (p *Pipeline) WalletEmpty() string {
	if p.OnWalletEmpty == "" {
		return WalletEmptyFinish
	}
	return p.OnWalletEmpty
}

// ParallelBefore returns the parallel stage a merge stage merges: the stage before it.
func (p *Pipeline) ParallelBefore(merge string) (*Stage, bool) {
	_, i, ok := p.Stage(merge)
	if !ok || i == 0 || !p.Stages[i-1].IsParallel() {
		return nil, false
	}
	return &p.Stages[i-1], true
}

// BranchStage finds a stage inside a parallel stage's branches by name: the parallel
// stage, the branch and the stage.
func (p *Pipeline) BranchStage(name string) (group *Stage, b *Branch, st *Stage, ok bool) {
	for i := range p.Stages {
		g := &p.Stages[i]
		for j := range g.Branches {
			for k := range g.Branches[j].Stages {
				if g.Branches[j].Stages[k].Name == name {
					return g, &g.Branches[j], &g.Branches[j].Stages[k], true
				}
			}
		}
	}
	return nil, nil, nil, false
}

// ---- lint ----

func branchPath(i, j int) string { return fmt.Sprintf("%s.branches[%d]", stagePath(i), j) }

// fanout checks the pipeline-level on_wallet_empty and where merges stand.
func (l *linter) fanout() {
	p := l.p
	switch p.OnWalletEmpty {
	case "", WalletEmptyFinish, WalletEmptyStop:
	default:
		l.errorAt("on-wallet-empty", fmt.Sprintf("on_wallet_empty is %q: use %s (the default: hops in flight finish, then the job stops) or %s (hops in flight are cancelled)", p.OnWalletEmpty, WalletEmptyFinish, WalletEmptyStop), "on_wallet_empty")
	}
	for i := range p.Stages {
		s := &p.Stages[i]
		path := stagePath(i)
		switch {
		case s.IsParallel():
			if i+1 >= len(p.Stages) || !p.Stages[i+1].IsMerge() {
				l.errorAt("merge", fmt.Sprintf("parallel stage %q is not followed by a merge: the stage right after it must be kind: merge, which receives every branch's result", s.Name), path+".kind", path)
			}
			if len(s.Routes) > 0 || s.Next != "" {
				l.errorAt("merge", fmt.Sprintf("parallel stage %q has routes or next:, but its branches always go on to its merge", s.Name), path+".routes", path+".next", path)
			}
		case s.IsMerge():
			if i == 0 || !p.Stages[i-1].IsParallel() {
				l.errorAt("merge", fmt.Sprintf("merge stage %q does not follow a parallel stage: a merge receives the branch results of the parallel stage right before it", s.Name), path+".kind", path)
			}
		}
		if !s.IsParallel() {
			if len(s.Branches) > 0 {
				l.errorAt("parallel", fmt.Sprintf("%s has branches but is a%s %s stage: only kind: parallel stages have branches", label(s, i), article(kindOf(s)), kindOf(s)), path+".branches", path)
			}
			if s.OnBranchFailure != "" || s.BranchTimeout > 0 {
				l.errorAt("parallel", fmt.Sprintf("%s sets on_branch_failure or branch_timeout, which only a kind: parallel stage has", label(s, i)), path+".on_branch_failure", path+".branch_timeout", path)
			}
		}
		if s.Judge && !s.IsMerge() {
			l.errorAt("merge", fmt.Sprintf("%s sets judge: true, which only a merge stage takes (a judge stage is kind: judge)", label(s, i)), path+".judge", path)
		}
		if !s.IsSubJob() && s.SubJob != nil {
			l.errorAt("subjob", fmt.Sprintf("%s has a subjob: but is a%s %s stage: make it kind: subjob", label(s, i), article(kindOf(s)), kindOf(s)), path+".subjob", path)
		}
	}
}

// parallel checks a parallel stage: its branches, their chains and their partitions.
// It returns the schema versions the branches output, for the stages after it.
func (l *linter) parallel(i int, s *Stage, names map[string]bool) []string {
	p, path, lbl := l.p, stagePath(i), label(s, i)
	switch s.OnBranchFailure {
	case "", BranchFailEscalate, BranchFailFail, BranchFailContinue:
	default:
		l.errorAt("on-branch-failure", fmt.Sprintf("%s has on_branch_failure %q: use %s (the default), %s or %s", lbl, s.OnBranchFailure, BranchFailEscalate, BranchFailFail, BranchFailContinue), path+".on_branch_failure", path)
	}
	if len(s.Tools) > 0 || s.Output.Type != "" || s.Writer != nil {
		l.errorAt("parallel", fmt.Sprintf("%s is a parallel stage: its branches hold the tools and outputs; declare them there", lbl), path+".tools", path+".output", path+".writer", path)
	}
	if len(s.Branches) < 2 && !p.bad[path+".branches"] {
		l.errorAt("parallel", fmt.Sprintf("%s has %d branches: a parallel stage runs two or more (list them under branches:)", lbl, len(s.Branches)), path+".branches", path)
	}
	var outputs []string
	ownerOfType := map[string]int{}   // output type -> branch
	ownerOfWrite := map[string]int{}  // write tool -> branch
	ownerOfSystem := map[string]int{} // written system -> branch
	seen := map[string]int{}
	for j := range s.Branches {
		b := &s.Branches[j]
		bp := branchPath(i, j)
		bl := fmt.Sprintf("branch %q of %s", b.Name, lbl)
		switch {
		case b.Name == "":
			bl = fmt.Sprintf("branch %d of %s", j+1, lbl)
			l.errorAt("branch-name", bl+" has no name: add name: (e.g. policy)", bp+".name", bp)
		case !stageNameRE.MatchString(b.Name) || len(b.Name) > maxNameLen:
			l.errorAt("branch-name", fmt.Sprintf("%s: the name is not valid: use lowercase letters, digits, '_' and '-', starting with a letter", bl), bp+".name", bp)
		default:
			if k, dup := seen[b.Name]; dup {
				l.errorAt("branch-name", fmt.Sprintf("%s: branch name %q is used twice (first by branch %d)", bl, b.Name, k+1), bp+".name", bp)
			}
			seen[b.Name] = j
		}
		if len(b.Stages) == 0 && !p.bad[bp+".stages"] {
			l.errorAt("branch-stages", bl+" has no stages: a branch is a stage or a short chain of them", bp+".stages", bp)
		}
		if len(b.Stages) > maxChain {
			l.errorAt("branch-stages", fmt.Sprintf("%s has %d stages: a branch is a short chain (at most %d)", bl, len(b.Stages), maxChain), bp+".stages", bp)
		}
		if len(b.Outputs) == 0 && !p.bad[bp+".outputs"] {
			l.errorAt("partition", bl+" declares no outputs: a branch names the artifact types it owns (outputs: [...])", bp+".outputs", bp)
		}
		// The partition: what the branch owns, against every other branch.
		for k, t := range b.Outputs {
			at := fmt.Sprintf("%s.outputs[%d]", bp, k)
			if o, dup := ownerOfType[t]; dup && o != j {
				l.errorAt("partition-output", fmt.Sprintf("%s owns output type %s, which branch %q also owns: partitions are hard, two branches never produce the same type", bl, t, s.Branches[o].Name), at, bp)
				continue
			}
			ownerOfType[t] = j
		}
		for k, name := range b.Tools {
			at := fmt.Sprintf("%s.tools[%d]", bp, k)
			t, ok := p.Tool(name)
			if !ok {
				l.errorAt("unknown-tool", fmt.Sprintf("%s owns tool %q, which is not in the tool catalogue", bl, name), at, bp)
				continue
			}
			if t.Access != AccessWrite {
				continue
			}
			if o, dup := ownerOfWrite[name]; dup && o != j {
				l.errorAt("partition-write-tool", fmt.Sprintf("%s owns write tool %s, which branch %q also owns: two branches never share a write tool", bl, name, s.Branches[o].Name), at, bp)
			} else {
				ownerOfWrite[name] = j
			}
			l.errorAt("branch-writes", fmt.Sprintf("%s owns write tool %s (system %s): no branch writes externally; the pipeline's writeback stage is the one writer", bl, name, t.System), at, bp)
		}
		// The chain: agent stages that keep to the partition.
		for k := range b.Stages {
			st := &b.Stages[k]
			sp := fmt.Sprintf("%s.stages[%d]", bp, k)
			sl := fmt.Sprintf("stage %q of %s", st.Name, bl)
			switch {
			case st.Name == "":
				l.errorAt("stage-name", sl+" has no name", sp+".name", sp)
			case !stageNameRE.MatchString(st.Name) || len(st.Name) > maxNameLen || st.Name == ToEscalate || st.Name == ToEnd:
				l.errorAt("stage-name", fmt.Sprintf("%s: the name is not valid", sl), sp+".name", sp)
			case names[st.Name]:
				l.errorAt("duplicate-stage", fmt.Sprintf("stage name %q is used twice: stage names are unique across the pipeline and its branches", st.Name), sp+".name", sp)
			default:
				names[st.Name] = true
			}
			if st.Writer != nil || kindOf(st) == KindWriteback {
				sys := ""
				if st.Writer != nil {
					sys = st.Writer.System
				}
				if o, dup := ownerOfSystem[sys]; dup && o != j {
					l.errorAt("partition-writer", fmt.Sprintf("%s writes system %q, which branch %q also writes: two branches never share a writer", sl, sys, s.Branches[o].Name), sp+".writer", sp+".kind", sp)
				} else {
					ownerOfSystem[sys] = j
				}
				l.errorAt("branch-writes", fmt.Sprintf("%s is a writer: no branch writes externally; the pipeline's writeback stage is the one writer", sl), sp+".writer", sp+".kind", sp)
			} else if kindOf(st) != KindAgent {
				l.errorAt("stage-kind", fmt.Sprintf("%s has kind %s: a branch chains agent stages", sl, kindOf(st)), sp+".kind", sp)
			}
			if len(st.Routes) > 0 || st.Next != "" || st.Revise != "" {
				l.errorAt("branch-stages", sl+" has routes, next: or revise: a branch runs its stages in order and ends at its last", sp+".routes", sp+".next", sp+".revise", sp)
			}
			if !schemaVersionRE.MatchString(st.Input) {
				l.errorAt("stage-input", fmt.Sprintf("%s reads %q, which is not a schema version: use type.vN", sl, st.Input), sp+".input", sp)
			}
			o := st.Output
			switch m := schemaVersionRE.FindStringSubmatch(o.SchemaVersion); {
			case o.Type == "":
				l.errorAt("artifact-type", sl+" names no output artifact type", sp+".output.type", sp+".output", sp)
			case m == nil || m[1] != o.Type:
				l.errorAt("artifact-version", fmt.Sprintf("%s: output schema_version %q is not a version of type %s (use %s.vN)", sl, o.SchemaVersion, o.Type, o.Type), sp+".output.schema_version", sp+".output", sp)
			default:
				outputs = append(outputs, o.SchemaVersion)
			}
			if o.Type != "" && !slices.Contains(b.Outputs, o.Type) {
				l.errorAt("partition", fmt.Sprintf("%s outputs %s, which its branch does not own (outputs: %s)", sl, o.Type, orWord(strings.Join(b.Outputs, ", "), "none")), sp+".output.type", sp+".output", sp)
			}
			for t, name := range st.Tools {
				at := fmt.Sprintf("%s.tools[%d]", sp, t)
				tool, ok := p.Tool(name)
				switch {
				case !ok:
					l.errorAt("unknown-tool", fmt.Sprintf("%s holds tool %q, which is not in the tool catalogue", sl, name), at, sp)
				case !slices.Contains(b.Tools, name):
					l.errorAt("partition", fmt.Sprintf("%s holds tool %s, which its branch does not own (tools: %s)", sl, name, orWord(strings.Join(b.Tools, ", "), "none")), at, sp)
				case tool.Access == AccessWrite && !slices.Contains(b.Tools, name):
					l.errorAt("branch-writes", fmt.Sprintf("%s holds write tool %s: no branch writes externally", sl, name), at, sp)
				}
			}
		}
	}
	return outputs
}

// merge checks a merge stage's own fields.
func (l *linter) merge(i int, s *Stage, branchOutputs []string) {
	path, lbl := stagePath(i), label(s, i)
	if s.Input != "" && !slices.Contains(branchOutputs, s.Input) {
		l.errorAt("stage-input", fmt.Sprintf("%s reads %s, which no branch of the parallel stage before it outputs (%s)", lbl, s.Input, orWord(strings.Join(branchOutputs, ", "), "none")), path+".input", path)
	}
	if s.Judge && s.Output.Type != "" && len(s.Criteria) == 0 {
		l.errorAt("merge", fmt.Sprintf("%s is a judge: list the criteria it judges the branches' results by", lbl), path+".criteria", path)
	}
	for j, name := range s.Tools {
		if t, ok := l.p.Tool(name); ok && t.Access == AccessWrite && s.Judge {
			l.errorAt("judge-no-write", fmt.Sprintf("%s is a judge and holds write tool %s: a judge never writes", lbl, name), fmt.Sprintf("%s.tools[%d]", path, j), path)
		}
	}
}

// subjob checks a subjob stage's task on its own (CheckSubJobs checks it against the
// pipeline it names).
func (l *linter) subjob(i int, s *Stage) {
	path, lbl := stagePath(i), label(s, i)
	sj := s.SubJob
	if sj == nil {
		if !l.p.bad[path+".subjob"] {
			l.errorAt("subjob", fmt.Sprintf("%s is kind: subjob but has no subjob: {pipeline, objective, output, tools, stop, max_hops}", lbl), path+".kind", path)
		}
		return
	}
	sp := path + ".subjob"
	if sj.Pipeline == "" || !pipelineNameRE.MatchString(sj.Pipeline) {
		l.errorAt("subjob", fmt.Sprintf("%s: subjob.pipeline %q is not a pipeline name: name the declared pipeline the nested run goes through", lbl, sj.Pipeline), sp+".pipeline", sp)
	}
	if sj.Pipeline != "" && sj.Pipeline == l.p.Name {
		l.errorAt("subjob", fmt.Sprintf("%s runs its own pipeline %s as a sub-job: a nested run of itself never ends", lbl, sj.Pipeline), sp+".pipeline", sp)
	}
	if strings.TrimSpace(sj.Objective) == "" {
		l.errorAt("subjob", lbl+": subjob.objective is empty: a sub-job's task is self-contained, say what it must achieve", sp+".objective", sp)
	}
	switch {
	case !schemaVersionRE.MatchString(sj.Output):
		l.errorAt("subjob", fmt.Sprintf("%s: subjob.output %q is not a schema version: name the artifact that returns (e.g. summary_md.v1)", lbl, sj.Output), sp+".output", sp)
	case s.Output.SchemaVersion != "" && s.Output.SchemaVersion != sj.Output:
		l.errorAt("subjob", fmt.Sprintf("%s outputs %s but its sub-job returns %s: the stage's output is what the sub-job returns", lbl, s.Output.SchemaVersion, sj.Output), sp+".output", sp)
	}
	switch sj.Stop {
	case StopJudged, StopCompleted:
	default:
		l.errorAt("subjob", fmt.Sprintf("%s: subjob.stop %q: use %s (stop once its judge passed the output, before any write) or %s (run to the end)", lbl, sj.Stop, StopJudged, StopCompleted), sp+".stop", sp)
	}
	if sj.MaxHops <= 0 && !l.p.bad[sp+".max_hops"] {
		l.errorAt("subjob", lbl+": subjob.max_hops must be greater than 0: a nested run has its own hop cap", sp+".max_hops", sp)
	}
	for j, name := range sj.Tools {
		if t, ok := l.p.Tool(name); ok && t.Access == AccessWrite {
			l.errorAt("subjob", fmt.Sprintf("%s gives its sub-job write tool %s: a sub-job never writes externally", lbl, name), fmt.Sprintf("%s.tools[%d]", sp, j), sp)
		}
	}
}

// CheckSubJobs checks each subjob stage of ps against the pipeline it names (rule subjob):
// the pipeline is declared, is no sub-job of itself through another, holds only the tools
// the sub-job gives it, produces the artifact that returns, and writes nothing unless the
// sub-job stops at its judge's PASS, before the write.
func CheckSubJobs(ps map[string]*Pipeline) []Problem {
	var out []Problem
	for _, p := range ps {
		if p == nil {
			continue
		}
		l := &linter{p: p}
		for i := range p.Stages {
			s := &p.Stages[i]
			if !s.IsSubJob() || s.SubJob == nil {
				continue
			}
			sp, lbl := stagePath(i)+".subjob", label(s, i)
			sub, ok := ps[s.SubJob.Pipeline]
			if !ok || sub == nil {
				l.errorAt("subjob", fmt.Sprintf("%s runs pipeline %q, which is not loaded", lbl, s.SubJob.Pipeline), sp+".pipeline", sp)
				continue
			}
			if sub.runsSubJob(ps, p.Name, map[string]bool{}) {
				l.errorAt("subjob", fmt.Sprintf("%s runs pipeline %s, which runs %s again as a sub-job: nested runs never end", lbl, sub.Name, p.Name), sp+".pipeline", sp)
			}
			produced := false
			for _, st := range sub.Stages {
				if st.Output.SchemaVersion == s.SubJob.Output {
					produced = true
				}
				for _, t := range st.Tools {
					if tool, _ := sub.Tool(t); tool.Access == AccessWrite && st.IsWriteback() {
						continue // its writeback never runs: see stop below
					}
					if !slices.Contains(s.SubJob.Tools, t) {
						l.errorAt("subjob", fmt.Sprintf("%s gives its sub-job the tools [%s], but stage %q of %s holds %s", lbl, strings.Join(s.SubJob.Tools, ", "), st.Name, sub.Name, t), sp+".tools", sp)
					}
				}
			}
			if !produced {
				l.errorAt("subjob", fmt.Sprintf("%s returns %s, which no stage of %s outputs", lbl, s.SubJob.Output, sub.Name), sp+".output", sp)
			}
			if sub.Writes() && s.SubJob.Stop != StopJudged {
				l.errorAt("subjob", fmt.Sprintf("%s runs %s, which writes, to its end: a sub-job never writes externally; use stop: %s", lbl, sub.Name, StopJudged), sp+".stop", sp)
			}
		}
		out = append(out, l.out...)
	}
	sortProblems(out)
	return out
}

// runsSubJob reports whether p runs pipeline name as a sub-job, directly or through others.
func (p *Pipeline) runsSubJob(ps map[string]*Pipeline, name string, seen map[string]bool) bool {
	if seen[p.Name] {
		return false
	}
	seen[p.Name] = true
	for _, s := range p.Stages {
		if !s.IsSubJob() || s.SubJob == nil {
			continue
		}
		if s.SubJob.Pipeline == name {
			return true
		}
		if sub, ok := ps[s.SubJob.Pipeline]; ok && sub.runsSubJob(ps, name, seen) {
			return true
		}
	}
	return false
}

// holds reports whether any stage holds the tool: a top-level stage, a branch's stage, or a
// sub-job it is given to.
func (p *Pipeline) holds(tool string) bool {
	for _, s := range p.Stages {
		if slices.Contains(s.Tools, tool) || (s.SubJob != nil && slices.Contains(s.SubJob.Tools, tool)) {
			return true
		}
		for _, b := range s.Branches {
			for _, st := range b.Stages {
				if slices.Contains(st.Tools, tool) {
					return true
				}
			}
		}
	}
	return false
}
