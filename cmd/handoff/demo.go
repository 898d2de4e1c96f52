package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, about("demo")+"Usage: handoff demo [flags]\n\nStarts the platform in-process on the embedded store, runs the sample support ticket\nthrough intake, retrieve, draft, judge (one FAIL, a revision, a PASS) and writeback,\nprints the hop timeline, then submits the same job again to show DUPLICATE and no\nsecond write. Exits 0 when the job completed and exactly one write happened.\n\nFlags:")
		fs.PrintDefaults()
	}
	var f stackFlags
	b := config.New(fs)
	// Free ports and a fresh folder by default, so the demo runs beside `handoff up`.
	bindStack(b, &f, "", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "")
	if err := b.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 2
	}
	if f.data == "" {
		dir, err := os.MkdirTemp("", "handoff-demo-")
		if err != nil {
			fmt.Fprintln(stderr, "handoff demo:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		f.data = dir
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	st, err := stack.Start(ctx, f.config(stderr))
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	defer st.Close()
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	res, err := demo.Run(ctx, stdout, cc, st.Artifacts)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	writes, err := st.Store.LedgerEntries(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "handoff demo:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nexternal writes in the ledger: %d (two submits of one job)\n", len(writes))
	if res.First.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || len(writes) != 1 {
		fmt.Fprintf(stderr, "handoff demo: expected a completed job and exactly one write; got %s and %d writes\n", res.First.GetState(), len(writes))
		return 1
	}
	return 0
}
