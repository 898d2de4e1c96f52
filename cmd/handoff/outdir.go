package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/handoffhq/handoff/internal/certs"
)

// outDir is what `handoff certs` and `handoff keys` share: the folder they write, the
// services they write for, and whether existing files are replaced.
type outDir struct {
	cmd, usage string
	dir        *string
	services   *string
	force      *bool
}

func bindOutDir(fset *flag.FlagSet, cmd, defDir, forceUsage, usage string) *outDir {
	fset.Usage = func() {} // printed by parse, to stdout for -h and to stderr for a bad flag
	return &outDir{
		cmd: cmd, usage: usage,
		dir:      fset.String("dir", defDir, "where to write"),
		services: fset.String("services", strings.Join(certs.DefaultServices, ","), "comma-separated service names"),
		force:    fset.Bool("force", false, forceUsage),
	}
}

// parse parses args into fset and returns the service names; when it returns ok false,
// the command exits with code (0 for --help) after parse said why.
func (o *outDir) parse(fset *flag.FlagSet, args []string, stdout, stderr io.Writer) (names []string, code int, ok bool) {
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, o.usage)
			return nil, 0, false
		}
		fmt.Fprint(stderr, "\n"+o.usage)
		return nil, 2, false
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(stderr, "handoff %s: unexpected argument %q\n\n%s", o.cmd, fset.Arg(0), o.usage)
		return nil, 2, false
	}
	if *o.dir == "" {
		fmt.Fprintf(stderr, "handoff %s: --dir is empty\n\n%s", o.cmd, o.usage)
		return nil, 2, false
	}
	for _, s := range strings.Split(*o.services, ",") {
		if s = strings.TrimSpace(s); s != "" {
			if err := certs.CheckServiceName(s); err != nil {
				fmt.Fprintf(stderr, "handoff %s: --services: %v\n", o.cmd, strings.TrimPrefix(err.Error(), "certs: "))
				return nil, 2, false
			}
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		fmt.Fprintf(stderr, "handoff %s: --services names no service\n", o.cmd)
		return nil, 2, false
	}
	return names, 0, true
}
