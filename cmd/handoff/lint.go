package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/handoffhq/handoff/internal/pipeline"
)

var lintUsage = about("lint") + `Usage: handoff lint PIPELINE.yaml|DIR...

Checks pipeline files against the structure and the design rules (one writer per external
system, no write tools on a judge, versioned artifacts, a hop cap, ...) and, for stages with
routes, the graph (route targets exist, every stage reachable, writeback only after a
judge's PASS, unique route names, cycles through no judge). A directory stands for the
*.yaml and *.yml files in it.

Prints each problem as file:line:col: rule: message, then the number of problems.
Exit status: 0 when every file is clean (warnings allowed), 1 when a file has problems,
2 on a usage error or a file that cannot be read.
`

// runLint implements `handoff lint`.
func runLint(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("lint", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {} // printed below, to stdout for -h and to stderr for a bad flag
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, lintUsage)
			return 0
		}
		fmt.Fprint(stderr, "\n"+lintUsage)
		return 2
	}
	if fset.NArg() == 0 {
		fmt.Fprint(stderr, "handoff lint: no pipeline file given\n\n"+lintUsage)
		return 2
	}

	files, ioFailed := lintFiles(fset.Args(), stderr)
	var (
		errorsN, warningsN int
		byName             = map[string]*pipeline.Pipeline{} // the first file of each name
	)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintf(stderr, "handoff lint: %v\n", err)
			ioFailed = true
			continue
		}
		p, problems, err := pipeline.Parse(file, data)
		var syn *pipeline.SyntaxError
		if errors.As(err, &syn) {
			problems = []pipeline.Problem{syn.Problem()}
		} else if err != nil {
			fmt.Fprintf(stderr, "handoff lint: %s: %v\n", file, err)
			ioFailed = true
			continue
		}
		if p != nil && p.Name != "" {
			// Pipelines are loaded by name: a name two files use is a problem of the later file.
			if first, dup := byName[p.Name]; dup {
				problems = append(problems, pipeline.CheckNames([]*pipeline.Pipeline{first, p})...)
			} else {
				byName[p.Name] = p
			}
		}
		fileErrors := 0
		for _, pr := range problems {
			fmt.Fprintln(stdout, pr.String())
			if pr.IsError() {
				fileErrors++
			} else {
				warningsN++
			}
		}
		errorsN += fileErrors
		if fileErrors == 0 && p != nil {
			fmt.Fprintf(stdout, "ok: %s (%d %s)\n", file, len(p.Stages), lintPlural(len(p.Stages), "stage", "stages"))
		}
	}

	if n := errorsN + warningsN; n > 0 {
		summary := fmt.Sprintf("%d %s", n, lintPlural(n, "problem", "problems"))
		if warningsN > 0 {
			summary += fmt.Sprintf(" (%d %s)", warningsN, lintPlural(warningsN, "warning", "warnings"))
		}
		fmt.Fprintln(stdout, summary)
	}
	switch {
	case ioFailed:
		return 2
	case errorsN > 0:
		return 1
	}
	return 0
}

// lintFiles expands directories into the pipeline files in them. It reports arguments that
// do not exist, or directories with no pipeline files.
func lintFiles(args []string, stderr io.Writer) (files []string, failed bool) {
	for _, arg := range args {
		info, err := os.Stat(arg)
		if err != nil {
			fmt.Fprintf(stderr, "handoff lint: %v\n", err)
			failed = true
			continue
		}
		if !info.IsDir() {
			files = append(files, arg)
			continue
		}
		found, err := pipeline.PipelineFiles(os.DirFS(arg), ".")
		if err != nil {
			fmt.Fprintf(stderr, "handoff lint: %s: %v\n", arg, err)
			failed = true
			continue
		}
		if len(found) == 0 {
			fmt.Fprintf(stderr, "handoff lint: %s: no *.yaml or *.yml files\n", arg)
			failed = true
			continue
		}
		for _, f := range found {
			files = append(files, filepath.Join(arg, filepath.FromSlash(f)))
		}
	}
	return files, failed
}

// lintPlural picks the word for n.
func lintPlural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
