// Command handoff is the CLI for the handoff platform: check packages and pipelines, print
// the JSON Schemas, and run the whole platform on one machine (up, demo).
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/handoffhq/handoff/internal/gctune"
)

// commands are the subcommands: each one's synopsis and what it does, said once here for
// the overview and for the first line of the command's own --help.
var commands = []struct{ name, synopsis, what string }{
	{"validate", "[--accept handoff.v1,handoff.v2] FILE|-", "check a JSON package, print its Ack"},
	{"schema", "handoff.v1|handoff.v2", "print a version's JSON Schema"},
	{"lint", "PIPELINE.yaml...", "check pipelines against the workshop rules"},
	{"up", "[flags]", "run coordinator, agent runner, writeback"},
	{"demo", "[--pipeline support-triage]", "run the sample support ticket (or three, with routes) end to end"},
	{"certs", "[--dir DIR] [--services a,b] [--days N]", "make a development CA and service certificates (mTLS)"},
	{"keys", "[--dir DIR] [--services a,b]", "make one service-token key per service (plaintext loopback)"},
	{"chaos", "[--jobs N] [--kills N] [--json]", "break a deployment (on Redis, or handoff up on bbolt) while jobs run; count lost jobs and double writes"},
	{"replay", "[--n 1000] [--invalid 0.10] [--duplicate 0.05] [--runner ADDR] [--json]", "replay generated packages as hops; check every ack, write, trace"},
	{"bench", "[--duration 3s] [--redis ADDR] [--json]", "measure a hop with and without the platform, and the targets"},
	{"explain", "[--coordinator ADDR] [--json] RUN_ID", "answer the five questions of every hop of a run, with evidence; flag violations"},
	{"contract", "check-data --store URL --rule FILE.proto", "report stored package values a candidate rule would reject"},
	{"store", "migrate --store redis://HOST:PORT", "move a Redis store of an older release to the hash-tagged key layout"},
}

// usage is the overview `handoff` and `handoff help` print.
var usage = func() string {
	var b strings.Builder
	b.WriteString("handoff: typed, enforced handoffs between agents\n\nUsage:\n")
	for _, c := range commands {
		line := fmt.Sprintf("  handoff %s %s", c.name, c.synopsis)
		if len(line) > 60 {
			fmt.Fprintf(&b, "%s\n%61s%s\n", line, "", c.what)
			continue
		}
		fmt.Fprintf(&b, "%-61s%s\n", line, c.what)
	}
	b.WriteString("\nRun 'handoff COMMAND --help' for a command's flags.\n")
	return b.String()
}()

// about is the first line of a command's --help: what the command is.
func about(name string) string {
	for _, c := range commands {
		if c.name == name {
			return "handoff " + name + ": " + c.what + "\n\n"
		}
	}
	panic("handoff: no command " + name)
}

func main() {
	// The services of up and demo, and the figures of bench, run with the services' GC policy.
	if _, err := gctune.Apply(); err != nil {
		fmt.Fprintln(os.Stderr, "handoff:", err)
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "validate":
		return runValidate(rest, stdin, stdout, stderr)
	case "schema":
		return runSchema(rest, stdout, stderr)
	case "lint":
		return runLint(rest, stdout, stderr)
	case "up":
		return runUp(rest, stdout, stderr)
	case "demo":
		return runDemo(rest, stdout, stderr)
	case "explain":
		return runExplain(rest, stdout, stderr)
	case "certs":
		return runCerts(rest, stdout, stderr)
	case "keys":
		return runKeys(rest, stdout, stderr)
	case "chaos":
		return runChaos(rest, stdout, stderr)
	case "replay":
		return runReplay(rest, stdout, stderr)
	case "bench":
		return runBench(rest, stdout, stderr)
	case "contract":
		return runContract(rest, stdout, stderr)
	case "store":
		return runStore(rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "handoff: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
