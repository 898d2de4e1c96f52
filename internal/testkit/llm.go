package testkit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// LLM is a scripted OpenAI-compatible chat-completions server (POST {URL}/chat/completions)
// on loopback. Each request is answered by the next Step of its script, so a test (or an
// offline example) knows exactly which tool calls and answers the model makes. It records
// every request it got.
type LLM struct {
	// URL is the API base, ending in /v1, as a client's base URL.
	URL string
	srv *httptest.Server

	mu       sync.Mutex
	script   Script
	requests []LLMRequest
}

// Step is one scripted answer.
type Step struct {
	// Status, when not 0 or 200, answers with this HTTP error (429, 503) instead.
	Status int
	// Content is the assistant message's text.
	Content string
	// Calls are the tool calls the assistant makes in this turn.
	Calls []Call
	// Finish is the finish_reason; "stop", or "tool_calls" when there are calls, by default.
	Finish string
	// PromptTokens and CompletionTokens are the usage reported.
	PromptTokens, CompletionTokens int64
}

// Call is one scripted tool call: the function name and its arguments, sent verbatim (so a
// script can send malformed JSON).
type Call struct {
	Name, Args string
}

// LLMRequest is one request the server got, decoded.
type LLMRequest struct {
	Model     string
	Messages  []map[string]any
	Tools     []string // the function names offered
	ToolSpecs []map[string]any
	MaxTokens int64
	// Auth is the Authorization header.
	Auth string
	Raw  map[string]any
}

// Script answers request n (0-based) of the server's life.
type Script func(n int, req LLMRequest) Step

// Steps is a Script that answers with the steps in order, and with an HTTP 500 naming the
// script's end after the last one.
func Steps(steps ...Step) Script {
	return func(n int, _ LLMRequest) Step {
		if n < len(steps) {
			return steps[n]
		}
		return Step{Status: http.StatusInternalServerError, Content: fmt.Sprintf("script has %d steps; request %d is past its end", len(steps), n+1)}
	}
}

// NewLLM starts a scripted server; Close stops it.
func NewLLM(script Script) *LLM {
	l := &LLM{script: script}
	l.srv = httptest.NewServer(l)
	l.URL = l.srv.URL + "/v1"
	return l
}

// ServeLLM starts a scripted server for one test.
func ServeLLM(t testing.TB, script Script) *LLM {
	t.Helper()
	l := NewLLM(script)
	t.Cleanup(l.Close)
	return l
}

// Close stops the server.
func (l *LLM) Close() { l.srv.Close() }

// SetScript replaces the script; the request count goes on.
func (l *LLM) SetScript(s Script) {
	l.mu.Lock()
	l.script = s
	l.mu.Unlock()
}

// Requests returns the requests received so far.
func (l *LLM) Requests() []LLMRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LLMRequest(nil), l.requests...)
}

func (l *LLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "not found: "+r.URL.Path, http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	req := LLMRequest{Raw: raw, Auth: r.Header.Get("Authorization")}
	req.Model, _ = raw["model"].(string)
	if mt, ok := raw["max_completion_tokens"].(float64); ok {
		req.MaxTokens = int64(mt)
	} else if mt, ok := raw["max_tokens"].(float64); ok {
		req.MaxTokens = int64(mt)
	}
	if ms, ok := raw["messages"].([]any); ok {
		for _, m := range ms {
			mm, _ := m.(map[string]any)
			req.Messages = append(req.Messages, mm)
		}
	}
	if ts, ok := raw["tools"].([]any); ok {
		for _, t := range ts {
			tm, _ := t.(map[string]any)
			fn, _ := tm["function"].(map[string]any)
			name, _ := fn["name"].(string)
			req.Tools = append(req.Tools, name)
			req.ToolSpecs = append(req.ToolSpecs, fn)
		}
	}
	l.mu.Lock()
	n := len(l.requests)
	l.requests = append(l.requests, req)
	script := l.script
	l.mu.Unlock()
	st := script(n, req)

	w.Header().Set("Content-Type", "application/json")
	if st.Status != 0 && st.Status != http.StatusOK {
		// A short Retry-After keeps a client's backoff (which honours it) fast in tests.
		w.Header().Set("Retry-After-Ms", "5")
		w.WriteHeader(st.Status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": st.Content, "type": "server_error"}})
		return
	}
	msg := map[string]any{"role": "assistant", "content": st.Content}
	finish := st.Finish
	if len(st.Calls) > 0 {
		var calls []any
		for i, c := range st.Calls {
			calls = append(calls, map[string]any{
				"id": fmt.Sprintf("call_%d_%d", n, i), "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": c.Args},
			})
		}
		msg["tool_calls"] = calls
		if finish == "" {
			finish = "tool_calls"
		}
	}
	if finish == "" {
		finish = "stop"
	}
	json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "created": 1, "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": msg}},
		"usage": map[string]any{"prompt_tokens": st.PromptTokens, "completion_tokens": st.CompletionTokens,
			"total_tokens": st.PromptTokens + st.CompletionTokens},
	})
}
