package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pii"
)

var validateUsage = about("validate") + `Usage: handoff validate [--accept VERSIONS] FILE|-

Checks one handoff package in its JSON form (protojson, snake_case or lowerCamelCase names)
the way a receiving stage does before any work: the version gate, then every rule of the
contract, then the personal-data check (an e-mail address, phone or card number in goal,
constraints, open_questions or next_hint is REJECTED_SCHEMA, rule pii). FILE - reads standard input. At most 64 KiB is read: a bigger package is rejected.

Prints the Ack as one line of JSON (proto field names) on standard output.

Flags:
  --accept VERSIONS   comma-separated contract versions this consumer accepts
                      (default handoff.v1,handoff.v2)

Exit status: 0 when the package is ACCEPTED, 1 when it is rejected (REJECTED_SCHEMA; the
Ack's reasons say why), 2 on a usage error or when FILE cannot be read.
`

// runValidate implements `handoff validate`.
func runValidate(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("validate", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {} // printed below, to stdout for -h and to stderr for a bad flag
	accept := fset.String("accept", contract.V1+","+contract.V2, "comma-separated accepted versions")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, validateUsage)
			return 0
		}
		fmt.Fprint(stderr, "\n"+validateUsage)
		return 2
	}
	if fset.NArg() != 1 {
		fmt.Fprintf(stderr, "handoff validate: want exactly one FILE (or - for standard input), got %d\n\n%s", fset.NArg(), validateUsage)
		return 2
	}

	var versions []string
	for _, s := range strings.Split(*accept, ",") {
		if s = strings.TrimSpace(s); s != "" {
			versions = append(versions, s)
		}
	}
	if len(versions) == 0 {
		fmt.Fprintf(stderr, "handoff validate: --accept names no version (known: %s, %s)\n", contract.V1, contract.V2)
		return 2
	}
	v, err := contract.NewValidator(versions...)
	if err != nil {
		fmt.Fprintf(stderr, "handoff validate: --accept: %v\n", err)
		return 2
	}

	data, err := readPackage(fset.Arg(0), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "handoff validate: %v\n", err)
		return 2
	}
	m, ack := v.AckJSON(data)
	if ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		// As every receiver does: personal data in the free text is refused, naming the
		// field, never the value.
		if fs := pii.Builtin().Scan(m); fs != nil {
			ack = contract.AckForMessage(m, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, pii.Reasons("", fs)...)
		}
	}
	out, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ack)
	if err != nil {
		fmt.Fprintf(stderr, "handoff validate: encoding the ack: %v\n", err)
		return 2
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", out); err != nil {
		fmt.Fprintf(stderr, "handoff validate: %v\n", err)
		return 2
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		return 1
	}
	return 0
}

// readPackage reads at most MaxPackageBytes+1 bytes of name ("-" for stdin): enough for the
// validator to see that a package is over the cap, and never an unbounded read of a huge or
// endless input.
func readPackage(name string, stdin io.Reader) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		if stdin == nil {
			return nil, errors.New("no standard input")
		}
		r = stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, contract.MaxPackageBytes+1))
	if err != nil {
		if name == "-" {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return data, nil
}
