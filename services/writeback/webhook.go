package writeback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// WebhookName is the Webhook target's default name.
const WebhookName = "webhook"

// DefaultWebhookTimeout bounds one webhook POST when WebhookConfig.Timeout is zero.
const DefaultWebhookTimeout = 10 * time.Second

// maxWebhookResponse caps how much of a webhook's answer is read.
const maxWebhookResponse = 1 << 20

// WebhookConfig configures a Webhook target.
type WebhookConfig struct {
	// Name the target is addressed by; default "webhook". Must match ^[a-z][a-z0-9_-]*$
	// (max 64), the rule on WriteRequest.target, or no request could address it.
	Name string
	// URL receives the POST; http or https.
	URL string
	// Timeout bounds one POST (connect, send, answer); default DefaultWebhookTimeout.
	Timeout time.Duration
	// Client sends the POST; default a client with no redirects followed. A redirect answer
	// is then a non-2xx answer, i.e. an error, rather than a POST silently turned into a GET.
	Client *http.Client
}

// Webhook is a target that POSTs the write as JSON to a URL:
//
//	{"key": K, "job_id": ..., "stage": ..., "artifact_type": ..., "artifact_uri": ..., "payload": "<artifact text>"}
//
// with the headers Idempotency-Key: K (so the receiver can enforce the key, which is what makes
// a write that is retried after a lost answer safe) and traceparent (when the package has one).
// A 2xx answer is success; the external id is the answer's JSON "id" member when it has one,
// else the HTTP status line ("HTTP/1.1 200 OK"). Any other answer is an error naming its status.
type Webhook struct {
	name    string
	url     string
	where   string // URL without query or credentials, for error messages
	timeout time.Duration
	client  *http.Client
}

// NewWebhook checks cfg and returns the target.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	name := cfg.Name
	if name == "" {
		name = WebhookName
	}
	if !validTargetName(name) {
		return nil, fmt.Errorf("webhook target name %q: must match %s (max 64 characters)", name, targetNamePattern)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("webhook url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("webhook url %q: scheme must be http or https", cfg.URL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("webhook url %q: no host", cfg.URL)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("webhook timeout %s: must not be negative", cfg.Timeout)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultWebhookTimeout
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	where := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	return &Webhook{name: name, url: cfg.URL, where: where, timeout: timeout, client: client}, nil
}

// Name returns the configured name ("webhook" by default).
func (w *Webhook) Name() string { return w.name }

// webhookBody is the JSON the webhook receives.
type webhookBody struct {
	Key          string `json:"key"`
	JobID        string `json:"job_id"`
	Stage        string `json:"stage"`
	ArtifactType string `json:"artifact_type"`
	ArtifactURI  string `json:"artifact_uri"`
	Payload      string `json:"payload"`
}

// Write POSTs the write and returns the external id.
func (w *Webhook) Write(ctx context.Context, in WriteInput) (string, error) {
	// The payload travels as a JSON string; bytes that are not UTF-8 would be silently
	// replaced by encoding/json, and a corrupted write is worse than a refused one.
	if !utf8.Valid(in.Payload) {
		return "", fmt.Errorf("webhook %s: artifact %s is not UTF-8 text and cannot be sent as the payload string", w.name, in.Artifact.GetUri())
	}
	body, err := json.Marshal(webhookBody{
		Key:          in.Key,
		JobID:        in.JobID,
		Stage:        in.Stage,
		ArtifactType: in.Artifact.GetType(),
		ArtifactURI:  in.Artifact.GetUri(),
		Payload:      string(in.Payload),
	})
	if err != nil {
		return "", fmt.Errorf("webhook %s: encode body: %w", w.name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("webhook %s: build request: %w", w.name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", in.Key)
	if in.Traceparent != "" {
		req.Header.Set("traceparent", in.Traceparent)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the full URL, query and all
		}
		return "", fmt.Errorf("webhook %s: POST %s: %w", w.name, w.where, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxWebhookResponse))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("webhook %s: POST %s answered %s%s", w.name, w.where, resp.Status, snippet(answer))
	}
	if err != nil {
		return "", fmt.Errorf("webhook %s: POST %s answered %s but the body could not be read: %w", w.name, w.where, resp.Status, err)
	}
	if id := responseID(answer); id != "" {
		return id, nil
	}
	return strings.TrimSpace(resp.Proto + " " + resp.Status), nil
}

// responseID returns the "id" member of a JSON object answer (a string, or a number as
// written), or "".
func responseID(answer []byte) string {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(answer, &top); err != nil {
		return ""
	}
	raw, ok := top["id"]
	if !ok {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err == nil {
		return n.String()
	}
	return ""
}

// snippet is the start of an error answer, for the error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
	if s == "" {
		return ""
	}
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return ": " + s
}
