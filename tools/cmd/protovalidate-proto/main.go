// Command protovalidate-proto writes buf/validate/validate.proto, printed from the
// descriptor embedded in the protovalidate Go module, into a folder that buf uses as
// a second module. The schema registry is out of reach from our build machines, and
// third-party proto files are not committed, so this is how the rules' definitions
// reach buf: from the same module version the Go code validates with.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	validatepb "buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"github.com/jhump/protoreflect/desc"
	"github.com/jhump/protoreflect/desc/protoprint"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: protovalidate-proto OUTDIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "protovalidate-proto:", err)
		os.Exit(1)
	}
}

func run(outDir string) error {
	fd, err := desc.WrapFile(validatepb.File_buf_validate_validate_proto)
	if err != nil {
		return fmt.Errorf("wrap descriptor: %w", err)
	}
	path := filepath.Join(outDir, fd.GetName())
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	p := protoprint.Printer{}
	if err := p.PrintProtoFile(fd, f); err != nil {
		f.Close()
		return fmt.Errorf("print %s: %w", fd.GetName(), err)
	}
	return f.Close()
}
