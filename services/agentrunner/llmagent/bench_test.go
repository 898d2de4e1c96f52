package llmagent_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// timedTransport sums the time spent in HTTP round trips to the model.
type timedTransport struct{ total atomic.Int64 }

func (t *timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := http.DefaultTransport.RoundTrip(r)
	t.total.Add(int64(time.Since(start)))
	return resp, err
}

// BenchmarkStageLoop runs one stage of two model calls (a kb.search call, then the
// answer) against the scripted server. loop-ns/op is the loop's own overhead per stage:
// the whole run minus the time inside the model's HTTP round trips.
func BenchmarkStageLoop(b *testing.B) {
	llm := testkit.ServeLLM(b, func(n int, _ testkit.LLMRequest) testkit.Step {
		if n%2 == 0 {
			return testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query":"refund"}`}}, PromptTokens: 500, CompletionTokens: 20}
		}
		return testkit.Step{Content: answer, PromptTokens: 600, CompletionTokens: 80}
	})
	tt := &timedTransport{}
	var kb atomic.Int32
	role, _ := llmagent.StageRole("retrieve")
	role.Tools = []llmagent.Tool{kbTool(&kb)}
	role.Tools[0].Call = func(context.Context, json.RawMessage) (string, error) { return `{"chunks":[]}`, nil }
	a, err := llmagent.New(llmagent.Config{BaseURL: llm.URL, Model: "m", PriceMicrosPer1KTokens: 100, HTTPClient: &http.Client{Transport: tt}}, role)
	if err != nil {
		b.Fatal(err)
	}
	in := retrieveInput(b, 1_000_000)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := a.Run(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	}
	total := time.Since(start)
	b.ReportMetric(float64(total-time.Duration(tt.total.Load()))/float64(b.N), "loop-ns/op")
}
