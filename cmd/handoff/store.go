package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/handoffhq/handoff/internal/store"
)

var storeUsage = about("store") + `Usage: handoff store migrate --store redis://[:password@]host:port[/db][?prefix=P]

migrate moves the keys an older release wrote on one Redis (run:<id>, one global run index,
sequence and ledger) to this release's layout, where every key of a job carries that job's
hash tag ({<id>}) so Redis Cluster can spread jobs over its shards. The services refuse a
store still in the old layout (they would see none of its runs). Stop them, migrate, start
them again. Each key is renamed, value and expiry kept; migrating again moves only what is
left. It runs on the single Redis the old release used: to move to a cluster afterwards,
import the migrated keys (redis-cli --cluster import).

Flags:
  --store URL   the deployment's redis:// store (with its ?prefix= if it has one)

Exit status: 0 when migrated (or nothing was left to move), 1 when it fails, 2 on a usage
error.
`

// runStore implements `handoff store`.
func runStore(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("store", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() { fmt.Fprint(stderr, storeUsage) }
	spec := fset.String("store", "", "the redis:// store to migrate")
	if len(args) == 0 || args[0] != "migrate" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, storeUsage)
			return 0
		}
		fmt.Fprint(stderr, "handoff store: want the subcommand migrate\n\n"+storeUsage)
		return 2
	}
	if err := fset.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(stderr, "handoff store migrate: unexpected argument %q\n", fset.Arg(0))
		return 2
	}
	o, err := store.ParseURL(*spec)
	if err == nil && (o == nil || len(o.Cluster) > 0) {
		err = fmt.Errorf("%q: want the redis:// URL of the one Redis the older release used", store.Redact(*spec))
	}
	if err != nil {
		fmt.Fprintf(stderr, "handoff store migrate: --store %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := store.OpenRedis(ctx, *o)
	if err != nil {
		fmt.Fprintf(stderr, "handoff store migrate: %v\n", err)
		return 1
	}
	defer st.Close()
	n, err := store.MigrateRedis(ctx, st)
	if err != nil {
		fmt.Fprintf(stderr, "handoff store migrate: %v (%d keys moved before it)\n", err, n)
		return 1
	}
	fmt.Fprintf(stdout, "handoff store migrate: %d keys moved to the hash-tagged layout\n", n)
	return 0
}
