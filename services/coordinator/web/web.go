// Package web is the operator page of the coordinator: the queue of escalated runs and a
// page per run where a person approves, returns, fails or rejects it. Server-rendered
// html/template, no build step. Every action calls the coordinator's own methods
// (ListEscalations, GetJob, ResolveEscalation) in-process: there is no second code path.
package web

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/coordinator"
)

// CookieName holds the operator token after the login form.
const CookieName = "handoff_operator"

//go:embed templates/*.html
var files embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"trim": strings.TrimPrefix,
	"usd":  func(m int64) string { return fmt.Sprintf("$%.2f", float64(m)/1e6) },
	"age": func(j *handoffv1.Job) string {
		t := j.GetEscalation().GetAt()
		if t == nil {
			t = j.GetUpdatedAt()
		}
		return time.Since(t.AsTime()).Round(time.Second).String()
	},
	"ts": func(t interface{ AsTime() time.Time }) string { return t.AsTime().UTC().Format(time.RFC3339) },
}).ParseFS(files, "templates/*.html"))

// Handler serves the operator page for srv.
type Handler struct {
	srv *coordinator.Server
	mux *http.ServeMux
}

// New returns the operator page's handler.
func New(srv *coordinator.Server) *Handler {
	h := &Handler{srv: srv, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.queue)
	h.mux.HandleFunc("GET /login", h.loginForm)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("GET /jobs/{run}", h.job)
	h.mux.HandleFunc("POST /jobs/{run}/resolve", h.resolve)
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method == http.MethodPost {
		// Forms only from this page: a browser sends Origin on cross-site POSTs.
		if o := r.Header.Get("Origin"); o != "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				http.Error(w, "cross-origin request refused", http.StatusForbidden)
				return
			}
		}
	}
	if !strings.HasPrefix(r.URL.Path, "/login") && !h.authorized(r) {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, "login.html", map[string]any{"Next": r.URL.Path})
		return
	}
	h.mux.ServeHTTP(w, r)
}

// token is the operator token the request presents: the Authorization header, else the cookie.
func token(r *http.Request) string {
	if v := r.Header.Get("Authorization"); v != "" {
		scheme, rest, _ := strings.Cut(v, " ")
		if strings.EqualFold(scheme, "bearer") {
			return strings.TrimSpace(rest)
		}
	}
	if c, err := r.Cookie(CookieName); err == nil {
		return c.Value
	}
	return ""
}

func (h *Handler) authorized(r *http.Request) bool {
	if !h.srv.OperatorTokenRequired() {
		return true
	}
	tok := token(r)
	return tok != "" && h.srv.CheckOperatorToken(tok)
}

// ctx carries the request's token to the coordinator methods as gRPC metadata, so they
// check it exactly as they do for a gRPC caller.
func ctx(r *http.Request) context.Context {
	return metadata.NewIncomingContext(r.Context(), metadata.Pairs("authorization", "Bearer "+token(r)))
}

func (h *Handler) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := tmpl.ExecuteTemplate(w, name, data); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (h *Handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	switch status.Code(err).String() {
	case "NotFound":
		code = http.StatusNotFound
	case "Unauthenticated":
		code = http.StatusUnauthorized
	case "InvalidArgument", "FailedPrecondition":
		code = http.StatusBadRequest
	case "Aborted":
		code = http.StatusConflict
	}
	w.WriteHeader(code)
	h.render(w, "error.html", map[string]any{"Error": status.Convert(err).Message()})
}

func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, "login.html", map[string]any{"Next": "/"})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	tok := r.PostFormValue("token")
	if !h.srv.CheckOperatorToken(tok) {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, "login.html", map[string]any{"Next": "/", "Error": "wrong token"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	next := r.PostFormValue("next")
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		next = "/"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) queue(w http.ResponseWriter, r *http.Request) {
	resp, err := h.srv.ListEscalations(ctx(r), &handoffv1.ListEscalationsRequest{PageSize: 200})
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, "queue.html", map[string]any{"Jobs": resp.GetJobs()})
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request) {
	c := ctx(r)
	resp, err := h.srv.GetJob(c, &handoffv1.GetJobRequest{RunId: r.PathValue("run")})
	if err != nil {
		h.fail(w, err)
		return
	}
	job := resp.GetJob()
	art, data, aerr := h.srv.Proposed(c, job)
	d := map[string]any{
		"Job": job, "Artifact": art, "Text": string(data), "Stages": h.srv.Stages(job.GetPipeline()),
		"Escalated": job.GetState() == handoffv1.JobState_JOB_STATE_ESCALATED,
		"Done":      r.URL.Query().Get("done"), "Duplicate": r.URL.Query().Get("dup") == "1",
	}
	if aerr != nil {
		d["ArtifactError"] = aerr.Error()
	}
	h.render(w, "job.html", d)
}

func (h *Handler) resolve(w http.ResponseWriter, r *http.Request) {
	c := ctx(r)
	runID := r.PathValue("run")
	req := &handoffv1.ResolveEscalationRequest{RunId: runID, Operator: strings.TrimSpace(r.PostFormValue("operator")), Comment: r.PostFormValue("comment")}
	// The textarea's text counts as an edit only when it differs from what was shown.
	var edit *string
	if r.PostForm.Has("artifact_text") {
		t := strings.ReplaceAll(r.PostFormValue("artifact_text"), "\r\n", "\n")
		if t != strings.ReplaceAll(r.PostFormValue("original_text"), "\r\n", "\n") {
			edit = &t
		}
	}
	switch action := r.PostFormValue("action"); action {
	case "approve":
		req.Action = &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{ArtifactText: edit}}
	case "return_to_stage":
		req.Action = &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: r.PostFormValue("stage"), ArtifactText: edit}}
	case "fail":
		req.Action = &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: r.PostFormValue("reason")}}
	case "reject_malformed":
		req.Action = &handoffv1.ResolveEscalationRequest_RejectMalformed{RejectMalformed: &handoffv1.RejectMalformedAction{Reason: r.PostFormValue("reason")}}
	default:
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, "error.html", map[string]any{"Error": fmt.Sprintf("unknown action %q", action)})
		return
	}
	resp, err := h.srv.ResolveEscalation(c, req)
	if err != nil {
		h.fail(w, err)
		return
	}
	q := url.Values{"done": {r.PostFormValue("action")}}
	if resp.GetDuplicate() {
		q.Set("dup", "1")
	}
	http.Redirect(w, r, "/jobs/"+url.PathEscape(runID)+"?"+q.Encode(), http.StatusSeeOther)
}
