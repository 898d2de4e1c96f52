package testkit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPTools is a real MCP tool server (modelcontextprotocol/go-sdk) with one read tool and
// one write tool, for the tests of model stages:
//
//   - kb_search (read, helpcenter): {"query"} -> the help-center chunks whose text has a
//     word of the query;
//   - crm_patch (write, crm): {"ticket_id", "note"} -> "patched <id>"; Writes counts them.
//
// Serve it in process (Server, over an in-memory or streamable-HTTP transport) or as a stdio
// subprocess (BuildMCPServer).
type MCPTools struct {
	// Delay is added to every call (a slow server, for timeouts).
	Delay time.Duration
	// CrashOn names a tool whose call ends the process mid-call (for the subprocess only:
	// it exits before answering).
	CrashOn string

	writes atomic.Int32
}

// Writes is how many crm_patch calls the server answered.
func (m *MCPTools) Writes() int { return int(m.writes.Load()) }

// KB is the help center kb_search searches.
var KB = []struct{ Key, Title, Text string }{
	{"hc-refund-policy", "Refund policy", "Refunds for duplicate charges are decided by the billing team within 5 days."},
	{"hc-double-charge", "Double charges", "A double charge is usually a pending authorization that drops off in 3 days."},
	{"hc-password-reset", "Reset your password", "Use the sign-in page link to reset a password; links expire in 1 hour."},
}

type kbArgs struct {
	Query string `json:"query" jsonschema:"words to look for"`
}

type patchArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket to patch"`
	Note     string `json:"note" jsonschema:"the note to add"`
}

// Server returns the MCP server.
func (m *MCPTools) Server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "handoff-testkit-tools", Version: "v1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "kb_search", Description: "Search the help center; returns matching chunks as JSON."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in kbArgs) (*mcp.CallToolResult, any, error) {
			m.before(ctx, "kb_search")
			var hits []string
			for _, c := range KB {
				for _, w := range strings.Fields(strings.ToLower(in.Query)) {
					if len(w) > 2 && strings.Contains(strings.ToLower(c.Title+" "+c.Text), w) {
						hits = append(hits, fmt.Sprintf(`{"key":%q,"title":%q,"text":%q}`, c.Key, c.Title, c.Text))
						break
					}
				}
			}
			return text(`{"chunks":[` + strings.Join(hits, ",") + `]}`), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crm_patch", Description: "Add a note to a ticket's CRM record (writes)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in patchArgs) (*mcp.CallToolResult, any, error) {
			m.before(ctx, "crm_patch")
			if in.TicketID == "" {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "ticket_id is required"}}}, nil, nil
			}
			m.writes.Add(1)
			return text("patched " + in.TicketID), nil, nil
		})
	return s
}

func (m *MCPTools) before(ctx context.Context, tool string) {
	if m.CrashOn == tool {
		os.Exit(3) // mid-call: the client never gets an answer
	}
	if m.Delay > 0 {
		select {
		case <-time.After(m.Delay):
		case <-ctx.Done():
		}
	}
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// ServeMCPHTTP serves tools over streamable HTTP on loopback for one test and returns the
// endpoint URL.
func ServeMCPHTTP(t testing.TB, tools *MCPTools) string {
	t.Helper()
	srv := tools.Server()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// BuildMCPServer builds the stdio MCP server (internal/testkit/mcpserver) once per test
// binary and returns its path. Run it with --crash-on TOOL or --delay D for the failure
// cases.
func BuildMCPServer(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "handoff-mcpserver-")
		if err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(dir, "mcpserver")
		cmd := exec.Command("go", "build", "-o", buildBin, "github.com/handoffhq/handoff/internal/testkit/mcpserver")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build mcpserver: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}
