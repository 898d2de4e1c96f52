package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/coordinator"
)

// runContract is `handoff contract check-data`: before a rule is tightened (an enum
// narrowed, a pattern added), check that the data already stored complies with it.
func runContract(args []string, stdout, stderr io.Writer) int {
	const usageText = "Usage: handoff contract check-data --store URL --rule FILE.proto [--message NAME]\n\n" +
		"Reads every stored run (bbolt file or redis:// URL, as --store of the services) and\n" +
		"checks the packages the rail built from it (the run's state, and each stage result's\n" +
		"and verdict's values) against a candidate rule: a protovalidate annotation in a proto\n" +
		"file, on a message with HandoffPackage's field numbers (a copy of handoff.v1's, or only\n" +
		"the fields the rule is about; imports: buf/validate/validate.proto, handoff/v1/*.proto,\n" +
		"files beside it). Prints each value the rule would reject with its run id and field\n" +
		"path. Exits 0 when the data complies (the rule can ship), 1 when it does not, 2 on a\n" +
		"bad flag, file or store.\n\nFlags:"
	fs := flag.NewFlagSet("handoff contract", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, about("contract")+usageText)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fs.Usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] != "check-data" {
		fmt.Fprintf(stderr, "handoff contract: unknown subcommand %q (have: check-data)\n", args[0])
		return 2
	}
	var storeURL, rule, message string
	b := config.New(fs)
	b.String(&storeURL, "store", "HANDOFF_STORE", "", "the store holding the runs: a bbolt file, or redis://host:port[/db][?prefix=P]")
	fs.StringVar(&rule, "rule", "", "the proto file with the candidate rule")
	fs.StringVar(&message, "message", "", "the candidate message to check packages against (default: its HandoffPackage)")
	if err := b.Parse(args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(stderr, "handoff contract check-data:", err)
		return 2
	}
	for name, v := range map[string]string{"--store": storeURL, "--rule": rule} {
		if v == "" {
			fmt.Fprintf(stderr, "handoff contract check-data: %s is required\n", name)
			return 2
		}
	}
	ctx := context.Background()
	cand, err := contract.LoadCandidate(ctx, rule, message)
	if err != nil {
		fmt.Fprintln(stderr, "handoff contract check-data:", err)
		return 2
	}
	st, err := store.OpenURL(ctx, storeURL)
	if err != nil {
		fmt.Fprintln(stderr, "handoff contract check-data: store:", err)
		return 2
	}
	defer st.Close()
	runs, pkgs, bad := 0, 0, 0
	err = eachRun(ctx, st, func(run *handoffv1.Job, evs []*handoffv1.JobEvent) error {
		runs++
		seen := map[contract.Finding]bool{}
		for _, p := range storedPackages(run, evs) {
			pkgs++
			found, err := cand.Check(p)
			if err != nil {
				return fmt.Errorf("run %s: %w", run.GetRunId(), err)
			}
			for _, f := range found {
				if seen[f] {
					continue // the same value in another package of the run
				}
				seen[f] = true
				bad++
				fmt.Fprintf(stdout, "run %s job %s: %s = %q: %s [%s]\n", run.GetRunId(), run.GetJobId(), f.Field, f.Value, f.Message, f.Rule)
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(stderr, "handoff contract check-data:", err)
		return 2
	}
	if bad > 0 {
		fmt.Fprintf(stdout, "%d stored values break %s (%d runs, %d packages): the data does not comply; do not tighten the rule yet\n", bad, cand.Message(), runs, pkgs)
		return 1
	}
	fmt.Fprintf(stdout, "the stored data complies with %s (%d runs, %d packages)\n", cand.Message(), runs, pkgs)
	return 0
}

// eachRun calls f with every stored run, in every state, and its events.
func eachRun(ctx context.Context, st store.Store, f func(*handoffv1.Job, []*handoffv1.JobEvent) error) error {
	after := ""
	for {
		runs, next, err := st.ListRuns(ctx, handoffv1.JobState_JOB_STATE_UNSPECIFIED, 200, after)
		if err != nil {
			return err
		}
		for _, r := range runs {
			evs, err := st.Events(ctx, r.GetRunId(), 0)
			if err != nil {
				return err
			}
			if err := f(r, evs); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		after = next
	}
}

// storedPackages are the packages the rail built from a run, as far as its stored state
// says: the one for its stage now (coordinator.PackageOf), and that one with each stage
// result's open questions and hint and each verdict's evaluator, which later hops replaced.
func storedPackages(run *handoffv1.Job, evs []*handoffv1.JobEvent) []*handoffv1.HandoffPackage {
	base := coordinator.PackageOf(run, run.GetStage(), run.GetTraceparent())
	out := []*handoffv1.HandoffPackage{base}
	for _, ev := range evs {
		switch {
		case ev.GetKind() == handoffv1.EventKind_EVENT_KIND_STAGE_RESULT && ev.GetResult() != nil:
			p := proto.CloneOf(base)
			p.OpenQuestions, p.NextHint = slices.Clone(ev.GetResult().GetOpenQuestions()), ev.GetResult().GetNextHint()
			out = append(out, p)
		case ev.GetKind() == handoffv1.EventKind_EVENT_KIND_VERDICT && ev.GetEvaluator() != nil:
			p := proto.CloneOf(base)
			p.Evaluator = proto.CloneOf(ev.GetEvaluator())
			out = append(out, p)
		}
	}
	return out
}
