package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

func packageFile(name string) string { return filepath.Join("..", "..", "testdata", "packages", name) }

func readPackageFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(packageFile(name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withoutMember returns a JSON object with one top-level member removed.
func withoutMember(t *testing.T, data []byte, member string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, member)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withMember returns a JSON object with one top-level member set to value.
func withMember(t *testing.T, data []byte, member string, value any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m[member] = value
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// endless yields 'x' forever and counts what was read from it.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	e.n += int64(len(p))
	return len(p), nil
}

func TestRunValidate(t *testing.T) {
	dir := t.TempDir()
	emptyFile := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(emptyFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bigFile := filepath.Join(dir, "big.json")
	big := append([]byte(`{"schema":"handoff.v1","next_hint":"`), bytes.Repeat([]byte("a"), 1<<20)...)
	if err := os.WriteFile(bigFile, append(big, `"}`...), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     []string
		stdin    io.Reader
		code     int
		status   handoffv1.AckStatus // checked when code is 0 or 1
		field    string              // a reason with this field and rule must be present
		rule     string
		stderr   string // substring of stderr when code is 2
		ackJobID string
		absent   string // a value the Ack must not echo
	}{
		{name: "valid", args: []string{packageFile("valid.json")}, code: 0,
			status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, ackJobID: "tkt_18422"},
		{name: "valid v2 from stdin", args: []string{"-"}, stdin: bytes.NewReader(readPackageFixture(t, "valid_v2.json")), code: 0,
			status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, ackJobID: "tkt_18422"},
		{name: "judge failed is schema-valid", args: []string{packageFile("judge_failed.json")}, code: 0,
			status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED},
		{name: "empty budget is schema-valid", args: []string{packageFile("empty_budget.json")}, code: 0,
			status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED},
		{name: "job_id removed", args: []string{"-"}, stdin: bytes.NewReader(withoutMember(t, readPackageFixture(t, "valid.json"), "job_id")), code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "job_id", rule: "required"},
		{name: "card number in the goal", args: []string{"-"}, stdin: bytes.NewReader(withMember(t, readPackageFixture(t, "valid.json"), "goal", "refund card 4111 1111 1111 1111")), code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "goal", rule: "pii", ackJobID: "tkt_18422", absent: "4111"},
		{name: "e-mail in a v2 open question", args: []string{"-"}, stdin: bytes.NewReader(withMember(t, readPackageFixture(t, "valid_v2.json"), "open_questions", []string{"tz?", "is jane@example.com hers?"})), code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "open_questions[1]", rule: "pii", absent: "jane@"},
		{name: "an order number is no card", args: []string{"-"}, stdin: bytes.NewReader(withMember(t, readPackageFixture(t, "valid.json"), "goal", "refund order 1234567812345678")), code: 0,
			status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED},
		{name: "unknown version", args: []string{packageFile("unknown_version.json")}, code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "schema", rule: "version.accepted", ackJobID: "tkt_18422"},
		{name: "v1-only consumer, v2 package", args: []string{"--accept", "handoff.v1", packageFile("valid_v2.json")}, code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "schema", rule: "version.accepted"},
		{name: "v2-only consumer, v1 package", args: []string{"--accept=handoff.v2", packageFile("valid.json")}, code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "schema", rule: "version.accepted"},
		{name: "garbage", args: []string{"-"}, stdin: bytes.NewReader([]byte("\x00\x01\xfe\xffPK\x03\x04 not json")), code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "", rule: "json.syntax"},
		{name: "malformed json", args: []string{"-"}, stdin: strings.NewReader(`{"schema":"handoff.v1",`), code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "", rule: "json.syntax"},
		{name: "empty file", args: []string{emptyFile}, code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "", rule: "required"},
		{name: "oversize file", args: []string{bigFile}, code: 1,
			status: handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, field: "", rule: "size.max"},
		{name: "missing file", args: []string{filepath.Join(dir, "nope.json")}, code: 2, stderr: "nope.json"},
		{name: "directory", args: []string{dir}, code: 2, stderr: "handoff validate:"},
		{name: "no file", args: nil, code: 2, stderr: "exactly one FILE"},
		{name: "two files", args: []string{emptyFile, emptyFile}, code: 2, stderr: "exactly one FILE"},
		{name: "unknown accept", args: []string{"--accept", "handoff.v1,handoff.v9", emptyFile}, code: 2, stderr: "handoff.v9"},
		{name: "empty accept", args: []string{"--accept", " , ", emptyFile}, code: 2, stderr: "no version"},
		{name: "bad flag", args: []string{"--strict", emptyFile}, code: 2, stderr: "Usage:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			stdin := tc.stdin
			if stdin == nil {
				stdin = strings.NewReader("")
			}
			code := runValidate(tc.args, stdin, &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			if code == 2 {
				if stdout.Len() != 0 {
					t.Errorf("stdout on a usage/I-O error: %q", stdout.String())
				}
				if !strings.Contains(stderr.String(), tc.stderr) {
					t.Errorf("stderr %q lacks %q", stderr.String(), tc.stderr)
				}
				return
			}
			out := stdout.String()
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
				t.Fatalf("want one line of JSON, got %q", out)
			}
			if !strings.Contains(out, `"job_id"`) && tc.ackJobID != "" {
				t.Errorf("ack does not use proto names: %s", out)
			}
			var ack handoffv1.Ack
			if err := protojson.Unmarshal([]byte(out), &ack); err != nil {
				t.Fatalf("stdout is not an Ack: %v: %s", err, out)
			}
			if ack.GetStatus() != tc.status {
				t.Fatalf("status %v, want %v: %s", ack.GetStatus(), tc.status, out)
			}
			if tc.ackJobID != "" && ack.GetJobId() != tc.ackJobID {
				t.Errorf("ack job_id %q, want %q", ack.GetJobId(), tc.ackJobID)
			}
			if tc.rule != "" {
				found := false
				for _, r := range ack.GetReasons() {
					found = found || (r.GetField() == tc.field && r.GetRule() == tc.rule)
				}
				if !found {
					t.Fatalf("no reason with field %q rule %q: %s", tc.field, tc.rule, out)
				}
			}
			if tc.absent != "" && strings.Contains(out, tc.absent) {
				t.Errorf("the Ack echoes %q: %s", tc.absent, out)
			}
			if code == 0 && len(ack.GetReasons()) != 0 {
				t.Errorf("accepted with reasons: %s", out)
			}
		})
	}
}

// An endless standard input is cut at the cap: a clear size rejection, never a hang.
func TestRunValidateBoundedRead(t *testing.T) {
	src := &endless{}
	var stdout, stderr bytes.Buffer
	if code := runValidate([]string{"-"}, src, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	if src.n > contract.MaxPackageBytes+1 {
		t.Fatalf("read %d bytes, cap is %d", src.n, contract.MaxPackageBytes+1)
	}
	if !strings.Contains(stdout.String(), `"size.max"`) {
		t.Fatalf("no size.max reason: %s", stdout.String())
	}
}

func TestRunValidateHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var stdout, stderr bytes.Buffer
		if code := runValidate([]string{arg}, nil, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d", arg, code)
		}
		for _, want := range []string{"--accept", "FILE|-", "Exit status"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%s: help lacks %q", arg, want)
			}
		}
	}
}
