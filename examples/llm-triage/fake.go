package main

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/handoffhq/handoff/internal/testkit"
)

// fakeModel is the scripted model of --fake-model: per stage (read from the system
// message) and turn (whether the last message is a tool result), the tool calls and answers
// a capable model would make for ticket T-1042. Usage is a quarter of the bytes sent and
// received, so spend follows what a real call would cost.
func fakeModel(_ int, req testkit.LLMRequest) testkit.Step {
	sys, _ := req.Messages[0]["content"].(string)
	last := req.Messages[len(req.Messages)-1]
	afterTool := last["role"] == "tool"
	var st testkit.Step
	switch stageOf(sys) {
	case "intake":
		if !afterTool {
			st.Calls = []testkit.Call{{Name: "tickets_get", Args: `{"ticket_id":"T-1042"}`}}
			break
		}
		st.Content = answerJSON(map[string]any{
			"ticket_id": "T-1042", "customer_id": "cus_9", "category": "billing_double_charge",
			"question": "Can the duplicate charge for order 5512 be refunded?",
			"facts":    []string{"order 5512", "2 x 49.00 EUR on 3 March"},
		}, "retrieve help-center articles on double charges", "the customer's timezone")
		st.Calls = []testkit.Call{{Name: "transfer_to_billing", Args: `{"reason":"a duplicate card charge","priority":"high"}`}}
	case "retrieve":
		if !afterTool {
			st.Calls = []testkit.Call{{Name: "kb_search", Args: `{"query":"double charge duplicate refund"}`}}
			break
		}
		tool, _ := last["content"].(string)
		var found struct {
			Chunks []map[string]any `json:"chunks"`
		}
		json.Unmarshal([]byte(tool), &found)
		st.Content = answerJSON(map[string]any{"chunks": found.Chunks, "no_hit": len(found.Chunks) == 0}, "draft from the two billing articles", "")
		route := "transfer_to_hit"
		if len(found.Chunks) == 0 {
			route = "transfer_to_no_hit"
		}
		st.Calls = []testkit.Call{{Name: route, Args: `{"reason":"the help center covers double charges"}`}}
	case "draft":
		st.Content = answerText("## Triage: T-1042 (billing_double_charge)\n\n"+
			"- The customer reports two charges of 49.00 EUR for order 5512 on 3 March. [hc-double-charge]\n"+
			"- A duplicate is often a pending authorization that drops off within 3 business days. [hc-double-charge]\n"+
			"- If both charges settle, the billing team decides on the duplicate within 5 business days. [hc-refund-policy]\n",
			"judge the summary")
	case "judge":
		b, _ := json.Marshal(map[string]any{"artifact": map[string]any{"verdict": "pass", "failures": []any{}}, "verdict": "pass", "failures": []any{}, "next_hint": "write it back"})
		st.Content = string(b)
	default:
		st.Status, st.Content = 400, "the fake model knows no stage in this system message"
	}
	var in int
	for _, m := range req.Messages {
		c, _ := m["content"].(string)
		in += len(c)
	}
	st.PromptTokens = int64(in/4 + 50*len(req.Tools))
	st.CompletionTokens = int64(len(st.Content)/4 + 20*len(st.Calls) + 5)
	return st
}

var stageRE = regexp.MustCompile(`^You are the "([a-z][a-z0-9_-]*)" stage`)

func stageOf(sys string) string {
	if m := stageRE.FindStringSubmatch(sys); m != nil {
		return m[1]
	}
	return ""
}

func answerJSON(artifact any, hint, question string) string {
	a, _ := json.Marshal(artifact)
	return answerText(string(a), hint, question)
}

func answerText(artifact, hint string, questions ...string) string {
	var qs []string
	for _, q := range questions {
		if strings.TrimSpace(q) != "" {
			qs = append(qs, q)
		}
	}
	b, _ := json.Marshal(map[string]any{"artifact": artifact, "next_hint": hint, "open_questions": qs})
	return string(b)
}
