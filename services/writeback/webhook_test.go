package writeback_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/writeback"
)

// hook records what a webhook receiver got.
type hook struct {
	mu      sync.Mutex
	headers []http.Header
	bodies  []map[string]string
	calls   atomic.Int32
}

func (h *hook) record(r *http.Request) {
	var body map[string]string
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	h.mu.Lock()
	h.headers = append(h.headers, r.Header.Clone())
	h.bodies = append(h.bodies, body)
	h.mu.Unlock()
}

func TestWebhookThroughService(t *testing.T) {
	h := &hook{}
	var failFirst atomic.Bool
	failFirst.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		if r.Method != http.MethodPost {
			http.Error(w, "method", http.StatusMethodNotAllowed)
			return
		}
		if failFirst.CompareAndSwap(true, false) {
			http.Error(w, "upstream busy", http.StatusServiceUnavailable)
			return
		}
		h.record(r)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_77","status":"queued"}`)
	}))
	defer srv.Close()

	e := newEnv(t, envOpts{targets: func(st *store.Bolt) []writeback.Target {
		wh, err := writeback.NewWebhook(writeback.WebhookConfig{URL: srv.URL + "/hooks/reply?token=s3cret"})
		if err != nil {
			t.Fatal(err)
		}
		return []writeback.Target{writeback.NewLedger(st), wh}
	}})
	ctx := ctxT(t)
	req := e.req()
	req.Target = "webhook"

	// First answer is 503: Unavailable naming the status, claim released, nothing recorded.
	_, err := e.client.Write(ctx, req)
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "503 Service Unavailable") {
		t.Fatalf("%v, want Unavailable naming 503", err)
	}
	if strings.Contains(st.Message(), "s3cret") {
		t.Errorf("error leaks the URL query: %s", st.Message())
	}
	if s := e.claimState(t, wantKey); s != 0 {
		t.Fatalf("key is %s after a failed POST, want released", s)
	}

	resp, err := e.client.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rc := resp.GetReceipt()
	if resp.GetDuplicate() || rc.GetExternalId() != "msg_77" || rc.GetTarget() != "webhook" || rc.GetIdempotencyKey() != wantKey {
		t.Errorf("response %v", resp)
	}
	again, err := e.client.Write(ctx, req)
	if err != nil || !again.GetDuplicate() {
		t.Fatalf("repeat %v %v", again, err)
	}
	if got := h.calls.Load(); got != 2 {
		t.Errorf("receiver got %d POSTs, want 2 (one 503, one write)", got)
	}
	if len(h.bodies) != 1 {
		t.Fatalf("recorded %d writes", len(h.bodies))
	}
	hd, body := h.headers[0], h.bodies[0]
	if got := hd.Get("Idempotency-Key"); got != wantKey {
		t.Errorf("Idempotency-Key %q, want %q", got, wantKey)
	}
	if got := hd.Get("traceparent"); got != traceparent {
		t.Errorf("traceparent %q", got)
	}
	if got := hd.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	want := map[string]string{
		"key": wantKey, "job_id": jobID, "stage": stage, "artifact_type": artType,
		"artifact_uri": e.art.GetUri(), "payload": string(e.body),
	}
	for k, v := range want {
		if body[k] != v {
			t.Errorf("body[%s] = %q, want %q", k, body[k], v)
		}
	}
	if n := len(e.ledger(t)); n != 0 {
		t.Errorf("ledger written by a webhook write: %d entries", n)
	}
}

func webhookInput() writeback.WriteInput {
	return writeback.WriteInput{
		Key: wantKey, JobID: jobID, Stage: stage,
		Artifact:    &handoffv1.Artifact{Type: artType, Uri: "file:///a/reply.md"},
		Payload:     []byte("hello"),
		Traceparent: traceparent,
	}
}

func TestWebhookAnswers(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		id      string // want external id ("" = want error)
		errHas  string
	}{
		{"json string id", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{"id":"evt_1"}`) }, "evt_1", ""},
		{"json number id", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{"id":12345678901234567890}`) }, "12345678901234567890", ""},
		{"no id: status line", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "ok")
		}, "HTTP/1.1 202 Accepted", ""},
		{"empty 204", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }, "HTTP/1.1 204 No Content", ""},
		{"409 is an error naming the status", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "duplicate key", http.StatusConflict)
		}, "", "409 Conflict: duplicate key"},
		{"redirect is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}, "", "302 Found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			wh, err := writeback.NewWebhook(writeback.WebhookConfig{Name: "crm", URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			if wh.Name() != "crm" {
				t.Errorf("name %q", wh.Name())
			}
			id, err := wh.Write(context.Background(), webhookInput())
			if tc.errHas == "" {
				if err != nil || id != tc.id {
					t.Errorf("id %q err %v, want %q", id, err, tc.id)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("err %v, want it to contain %q", err, tc.errHas)
			}
		})
	}
}

func TestWebhookTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	wh, err := writeback.NewWebhook(writeback.WebhookConfig{URL: srv.URL, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := wh.Write(context.Background(), webhookInput()); err == nil {
		t.Fatal("no error from a receiver that never answers")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
}

func TestWebhookConfigErrors(t *testing.T) {
	for _, cfg := range []writeback.WebhookConfig{
		{URL: ""},
		{URL: "ftp://example.com/x"},
		{URL: "http:///nohost"},
		{URL: "http://example.com", Name: "Bad Name"},
		{URL: "http://example.com", Timeout: -time.Second},
	} {
		if _, err := writeback.NewWebhook(cfg); err == nil {
			t.Errorf("NewWebhook(%+v) succeeded", cfg)
		}
	}
	wh, err := writeback.NewWebhook(writeback.WebhookConfig{URL: "https://example.com/h"})
	if err != nil || wh.Name() != writeback.WebhookName {
		t.Errorf("default: %v %v", wh, err)
	}
}
