// Command handoff is the CLI for the handoff platform: check packages and pipelines, print
// the JSON Schemas, and run the whole platform on one machine (up, demo).
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `handoff: typed, enforced handoffs between agents

Usage:
  handoff validate [--accept handoff.v1,handoff.v2] FILE|-   check a JSON package, print its Ack
  handoff schema handoff.v1|handoff.v2                       print a version's JSON Schema
  handoff lint PIPELINE.yaml...                              check pipelines against the workshop rules
  handoff up [flags]                                         run coordinator, agent runner, writeback
  handoff demo [--pipeline support-triage]                   run the sample support ticket (or three, with routes) end to end
  handoff certs [--dir DIR] [--services a,b] [--days N]      make a development CA and service certificates (mTLS)
  handoff keys [--dir DIR] [--services a,b]                  make one service-token key per service (plaintext loopback)
  handoff chaos [--jobs N] [--kills N] [--json]              break a multi-process deployment while jobs run; count lost jobs and double writes
  handoff replay [--n 1000] [--invalid 0.10] [--duplicate 0.05] [--runner ADDR] [--json]
                                                             replay generated packages as hops; check every ack, write, trace
  handoff bench [--duration 3s] [--redis ADDR] [--json]      measure a hop with and without the platform, and the targets

Run 'handoff COMMAND --help' for a command's flags.
`

func main() {
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
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "handoff: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
