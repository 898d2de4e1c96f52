package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/handoffhq/handoff/internal/certs"
)

var certsUsage = about("certs") + `Usage: handoff certs [--dir DIR] [--services NAMES] [--days N] [--force]

Makes a development CA and one certificate per service for mutual TLS between the
services. Each certificate names its service as spiffe://handoff.local/<service> (and
CN=<service>), is valid for localhost, <service>, 127.0.0.1 and ::1, and works for its
service as a server and as a client. Keys are ECDSA P-256, written 0600.

Existing files are kept: a run adds the services that have no certificate yet, signed by
the existing CA. --force replaces everything, CA included.

Flags:
  --dir DIR          where to write (default handoff-certs)
  --services NAMES   comma-separated service names
                     (default coordinator,agentrunner,writeback,operator)
  --days N           validity in days (default 30)
  --force            replace existing files

Exit status: 0 when the files are in place, 1 when they cannot be made (existing files
that do not fit together, an unwritable directory), 2 on a usage error.
`

// runCerts implements `handoff certs`.
func runCerts(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("certs", flag.ContinueOnError)
	fset.SetOutput(stderr)
	days := fset.Int("days", 30, "validity in days")
	out := bindOutDir(fset, "certs", "handoff-certs", "replace existing files", certsUsage)
	names, code, ok := out.parse(fset, args, stdout, stderr)
	if !ok {
		return code
	}
	dir, force := out.dir, out.force
	const maxDays = 3650
	if *days < 1 || *days > maxDays {
		fmt.Fprintf(stderr, "handoff certs: --days %d: want 1 to %d\n", *days, maxDays)
		return 2
	}

	res, err := certs.GenerateWith(certs.Options{Dir: *dir, Services: names, Validity: time.Duration(*days) * 24 * time.Hour, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "handoff %v\n", err)
		if res != nil && len(res.Written) > 0 {
			fmt.Fprintf(stderr, "handoff certs: written before the error: %s\n", strings.Join(res.Written, ", "))
		}
		return 1
	}
	for _, f := range res.Written {
		note := ""
		if strings.HasSuffix(f, "-key.pem") {
			note = "  (private, 0600)"
		}
		fmt.Fprintf(stdout, "wrote %s%s\n", f, note)
	}
	for _, f := range res.Kept {
		fmt.Fprintf(stdout, "kept  %s  (exists; --force replaces it)\n", f)
	}
	for _, f := range res.Stale {
		fmt.Fprintf(stderr, "handoff certs: warning: %s was signed by the replaced CA and no longer verifies; add its service to --services\n", f)
	}
	if len(res.Written) > 0 {
		fmt.Fprintf(stdout, "\nNew certificates are valid for %d days.\n", *days)
	}
	caPath := filepath.Join(*dir, certs.CAFile)
	op := names[0]
	for _, n := range names {
		if n == "operator" {
			op = n
		}
	}
	fmt.Fprintf(stdout, `
Each service uses its own pair, <service>.pem and <service>-key.pem, as server and as
client. A server requires a client certificate signed by %[1]s
and reads the caller's identity from its URI SAN, spiffe://%[2]s/<service>.
Keep %[3]s private and out of version control.

Call a service that runs with these certificates by hand, as %[4]q
(here the agent runner's default port):
  grpcurl -cacert %[1]s -cert %[5]s -key %[6]s 127.0.0.1:50052 list
Inspect a certificate:
  openssl x509 -noout -text -in %[5]s
`, caPath, certs.TrustDomain, filepath.Join(*dir, certs.CAKeyFile), op, certs.CertFile(*dir, op), certs.KeyFile(*dir, op))
	return 0
}
