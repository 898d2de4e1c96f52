package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

var keysUsage = about("keys") + `Usage: handoff keys [--dir DIR] [--services NAMES] [--force]

Makes one Ed25519 token key per service, for service tokens between services that run
with --plaintext-loopback (mTLS, ` + "`handoff certs`" + `, is the way between hosts):

  DIR/<service>.key         the service's private key (PEM, PKCS #8), 0600: give it to
                            that service only, as --token-key-file
  DIR/public/<service>.pub  its public key: give the whole public/ folder to every
                            service, as --token-public-keys

A service signs the tokens of its calls with its own key, each for the one service it
calls and valid for at most 10 minutes; the called service checks them against the
public keys. No service holds a key that mints another's identity.

Existing keys are kept: a run adds the services that have none and rewrites a missing
.pub from its key. --force replaces them all.

Flags:
  --dir DIR          where to write (default handoff-keys)
  --services NAMES   comma-separated service names
                     (default coordinator,agentrunner,writeback,operator)
  --force            replace existing keys

Exit status: 0 when the files are in place, 1 when they cannot be made (an existing key
that does not load or does not match its .pub, an unwritable directory), 2 on a usage
error.
`

// runKeys implements `handoff keys`.
func runKeys(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("keys", flag.ContinueOnError)
	fset.SetOutput(stderr)
	out := bindOutDir(fset, "keys", "handoff-keys", "replace existing keys", keysUsage)
	names, code, ok := out.parse(fset, args, stdout, stderr)
	if !ok {
		return code
	}
	dir, force := out.dir, out.force

	res, err := identity.GenerateKeys(*dir, names, *force)
	if err != nil {
		fmt.Fprintf(stderr, "handoff %v\n", err)
		if res != nil && len(res.Written) > 0 {
			fmt.Fprintf(stderr, "handoff keys: written before the error: %s\n", strings.Join(res.Written, ", "))
		}
		return 1
	}
	for _, f := range res.Written {
		note := ""
		if strings.HasSuffix(f, ".key") {
			note = "  (private, 0600)"
		}
		fmt.Fprintf(stdout, "wrote %s%s\n", f, note)
	}
	for _, f := range res.Kept {
		fmt.Fprintf(stdout, "kept  %s  (exists; --force replaces it)\n", f)
	}
	pub := filepath.Join(*dir, identity.PublicDir)
	fmt.Fprintf(stdout, "\nRun each service with its own key and the public folder, on loopback:\n")
	for _, svc := range []string{"coordinator", "agentrunner", "writeback"} {
		for _, n := range names {
			if n == svc {
				fmt.Fprintf(stdout, "  %-11s --plaintext-loopback --token-key-file %s --token-public-keys %s\n", svc, identity.KeyFile(*dir, svc), pub)
			}
		}
	}
	fmt.Fprintf(stdout, "Keep the .key files private and out of version control.\n")
	return 0
}
