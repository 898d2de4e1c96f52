package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The example's MCP tool server: a ticket lookup and a KB search (read), and a CRM patch
// (write, which only the writeback stage holds: no model stage is ever offered it).

type ticket struct {
	TicketID   string `json:"ticket_id"`
	CustomerID string `json:"customer_id"`
	Subject    string `json:"subject"`
	Body       string `json:"body"`
}

var tickets = map[string]ticket{
	"T-1042": {"T-1042", "cus_9", "Charged twice for order 5512",
		"Hi, my card was charged twice for order 5512 (2 x 49.00 EUR on 3 March). Can I get the duplicate refunded?"},
}

type chunk struct {
	Key   string `json:"key"`
	Title string `json:"title"`
	Text  string `json:"text"`
}

var kb = []chunk{
	{"hc-double-charge", "Double charges", "A double charge is usually a pending authorization that drops off within 3 business days."},
	{"hc-refund-policy", "Refund policy", "Refunds for duplicate charges are decided by the billing team within 5 business days."},
	{"hc-password-reset", "Reset your password", "Use the link on the sign-in page; reset links expire after 1 hour."},
}

type lookupArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket id, e.g. T-1042"`
}

type searchArgs struct {
	Query string `json:"query" jsonschema:"words to search the help center for"`
}

type patchArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket whose CRM record to patch"`
	Note     string `json:"note" jsonschema:"the note to add"`
}

var patches atomic.Int32

func toolServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "llm-triage-desk", Version: "v1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "ticket_lookup", Description: "Look a support ticket up by id; returns it as JSON."},
		func(_ context.Context, _ *mcp.CallToolRequest, in lookupArgs) (*mcp.CallToolResult, any, error) {
			t, ok := tickets[strings.TrimSpace(in.TicketID)]
			if !ok {
				return textResult("no ticket "+in.TicketID, true), nil, nil
			}
			b, _ := json.Marshal(t)
			return textResult(string(b), false), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "kb_search", Description: "Search the help center; returns the matching articles as JSON chunks."},
		func(_ context.Context, _ *mcp.CallToolRequest, in searchArgs) (*mcp.CallToolResult, any, error) {
			hits := []chunk{}
			for _, c := range kb {
				for _, w := range strings.Fields(strings.ToLower(in.Query)) {
					if len(w) > 3 && strings.Contains(strings.ToLower(c.Title+" "+c.Text), w) {
						hits = append(hits, c)
						break
					}
				}
			}
			b, _ := json.Marshal(map[string]any{"chunks": hits})
			return textResult(string(b), false), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crm_patch", Description: "Add a note to a ticket's CRM record. Writes."},
		func(_ context.Context, _ *mcp.CallToolRequest, in patchArgs) (*mcp.CallToolResult, any, error) {
			patches.Add(1)
			return textResult("patched "+in.TicketID, false), nil, nil
		})
	return s
}

func textResult(s string, isErr bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: isErr, Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
