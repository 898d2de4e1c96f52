package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMain serves the MCP tools when the test binary is started as the example's tool
// server (os.Executable is the test binary here).
func TestMain(m *testing.M) {
	if os.Getenv(toolsEnv) == "stdio" {
		if err := toolServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestFakeModel: the example runs offline end to end and prints each stage's recorded tool
// calls, the transfers taken, the spend per stage, and one write.
func TestFakeModel(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--fake-model"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"tool tickets.get            ok",
		"tool kb.search              ok",
		`transfer: billing (high) "a duplicate card charge"`,
		"transfer: hit (normal)",
		"state COMPLETED",
		"write: 1, target ledger, entry ledger-000001, key tkt_1042:writeback:summary_md",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	// Money is exact: the stages' spend adds up to what the rail debited.
	stages := regexp.MustCompile(`(?m)^stage \S+ +spent +([1-9][0-9]*) micro-USD$`).FindAllStringSubmatch(s, -1)
	var sum int
	for _, m := range stages {
		n, _ := strconv.Atoi(m[1])
		sum += n
	}
	total := regexp.MustCompile(`spent (\d+) micro-USD in all`).FindStringSubmatch(s)
	if len(stages) != 4 || total == nil || strconv.Itoa(sum) != total[1] {
		t.Errorf("%d stages with a spend line summing to %d, total %v; want 4 adding up to the total:\n%s", len(stages), sum, total, s)
	}
	if strings.Contains(s, "crm.patch") {
		t.Errorf("a model stage was offered or called crm.patch:\n%s", s)
	}
}
