package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"github.com/handoffhq/handoff/gen/jsonschema"
	"github.com/handoffhq/handoff/internal/contract"
)

var schemaUsage = about("schema") + `Usage: handoff schema NAME

Prints a JSON Schema (Draft 2020-12, one self-contained bundle) generated from the contract,
for validating packages outside Go.

NAME is a contract version, handoff.v1 or handoff.v2, for its HandoffPackage, or the full
name of one message of it (handoff.v1.Ack, handoff.v2.Budget, ...). --list prints every name.

Exit status: 0 on success, 2 on a usage error or an unknown NAME.
`

const schemaSuffix = ".schema.bundle.json"

// runSchema implements `handoff schema`.
func runSchema(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("schema", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {}
	list := fset.Bool("list", false, "print every schema name")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, schemaUsage)
			return 0
		}
		fmt.Fprint(stderr, "\n"+schemaUsage)
		return 2
	}
	names, err := schemaNames()
	if err != nil {
		fmt.Fprintf(stderr, "handoff schema: %v\n", err)
		return 2
	}
	if *list {
		if fset.NArg() != 0 {
			fmt.Fprint(stderr, "handoff schema: --list takes no NAME\n\n"+schemaUsage)
			return 2
		}
		fmt.Fprintln(stdout, contract.V1)
		fmt.Fprintln(stdout, contract.V2)
		for _, n := range names {
			fmt.Fprintln(stdout, n)
		}
		return 0
	}
	if fset.NArg() != 1 {
		fmt.Fprintf(stderr, "handoff schema: want exactly one NAME (%s or %s)\n\n%s", contract.V1, contract.V2, schemaUsage)
		return 2
	}
	name := fset.Arg(0)
	if name == contract.V1 || name == contract.V2 {
		name += ".HandoffPackage"
	}
	if !slices.Contains(names, name) {
		fmt.Fprintf(stderr, "handoff schema: unknown name %q: accepted are %s and %s (their HandoffPackage), or a full message name such as %s.Ack (see --list)\n",
			fset.Arg(0), contract.V1, contract.V2, contract.V1)
		return 2
	}
	data, err := jsonschema.FS.ReadFile(name + schemaSuffix)
	if err != nil {
		fmt.Fprintf(stderr, "handoff schema: %v\n", err)
		return 2
	}
	if _, err := stdout.Write(data); err != nil {
		fmt.Fprintf(stderr, "handoff schema: %v\n", err)
		return 2
	}
	return 0
}

// schemaNames lists the full message names that have an embedded schema, sorted.
func schemaNames() ([]string, error) {
	entries, err := fs.ReadDir(jsonschema.FS, ".")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), schemaSuffix); ok && !e.IsDir() {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}
