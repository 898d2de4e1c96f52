// Package web is the operator page of the coordinator: the queue of escalated runs and a
// page per run where a person approves, returns, fails or rejects it. Server-rendered
// html/template, no build step. Every action calls the coordinator's own methods
// (ListEscalations, GetJob, ResolveEscalation) in-process, after the same identity check
// their gRPC callers pass (the coordinator's identity.Authorizer): there is no second rule.
//
// Sign-in takes the operator token once and answers with a signed session cookie that
// expires (Options.SessionTTL) and never holds the token; sign-out revokes it. Failed
// sign-ins count against the same per-address allowance as failed operator tokens on gRPC.
package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/services/coordinator"
)

// CookieName holds the signed operator session after sign-in.
const CookieName = "handoff_session"

// DefaultSessionTTL is how long a sign-in lasts.
const DefaultSessionTTL = 8 * time.Hour

//go:embed templates/*.html
var files embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"trim":   strings.TrimPrefix,
	"usd":    usd,
	"escnum": func(e *handoffv1.Escalation) uint32 { return max(e.GetNumber(), 1) },
	// held is the run's claim while it holds the current escalation and lasts.
	"held": func(j *handoffv1.Job) *handoffv1.Claim {
		c := j.GetClaim()
		if c == nil || c.GetEscalation() != max(j.GetEscalation().GetNumber(), 1) || !c.GetExpiresAt().AsTime().After(time.Now()) {
			return nil
		}
		return c
	},
	"age": func(j *handoffv1.Job) string {
		t := j.GetEscalation().GetAt()
		if t == nil {
			t = j.GetUpdatedAt()
		}
		return time.Since(t.AsTime()).Round(time.Second).String()
	},
	"ts": func(t interface{ AsTime() time.Time }) string { return t.AsTime().UTC().Format(time.RFC3339) },
	// clock is a time of day to the microsecond: branches side by side show their overlap.
	"clock": func(t interface{ AsTime() time.Time }) string { return t.AsTime().UTC().Format("15:04:05.000000") },
	"dur": func(d interface{ AsDuration() time.Duration }) string {
		return d.AsDuration().Round(time.Millisecond).String()
	},
	// move names how the rail moved a run: the route its stage chose, else the rail's own
	// move (next, pass, revise, reroute, operator).
	"move": func(t *handoffv1.Transfer) string {
		if r := t.GetRoute(); r != nil {
			return r.GetName()
		}
		return strings.ToLower(strings.TrimPrefix(t.GetMove().String(), "MOVE_"))
	},
}).ParseFS(files, "templates/*.html"))

// usd shows micro-dollars exactly: at least cents, more digits only where the amount has
// them ($0.011, $1.50, $0.000001), never rounded.
func usd(m int64) string {
	sign := ""
	u := uint64(m)
	if m < 0 {
		sign, u = "-", uint64(-(m+1))+1
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", u%1_000_000), "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return fmt.Sprintf("%s$%d.%s", sign, u/1_000_000, frac)
}

// Options configures the page.
type Options struct {
	// SessionTTL is how long a sign-in lasts; default DefaultSessionTTL.
	SessionTTL time.Duration
	// Logger records sign-ins and sign-outs; default slog.Default().
	Logger *slog.Logger
	// Now is the clock of sessions; default time.Now.
	Now func() time.Time
}

// Handler serves the operator page for srv.
type Handler struct {
	srv      *coordinator.Server
	authz    *identity.Authorizer
	sessions *sessions
	log      *slog.Logger
	mux      *http.ServeMux
}

// New returns the operator page's handler. authz must be the coordinator server's own
// identity check, with operator credentials: the page never runs without them.
func New(srv *coordinator.Server, authz *identity.Authorizer, opts Options) (*Handler, error) {
	if authz == nil || authz.Operators() == nil {
		return nil, errors.New("web: the operator page needs operator credentials (an identity.Authorizer WithOperators)")
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ss, err := newSessions(opts.SessionTTL, opts.Now)
	if err != nil {
		return nil, err
	}
	h := &Handler{srv: srv, authz: authz, sessions: ss, log: opts.Logger, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.queue)
	h.mux.HandleFunc("GET /login", h.loginForm)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /logout", h.logout)
	h.mux.HandleFunc("GET /jobs/{run}", h.job)
	h.mux.HandleFunc("POST /jobs/{run}/resolve", h.resolve)
	h.mux.HandleFunc("POST /jobs/{run}/claim", h.claim)
	return h, nil
}

type sessionKey struct{}

// session is the signed-in operator of a request that passed ServeHTTP's check.
type session struct {
	id     identity.Identity
	sid    string
	expiry time.Time
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodPost {
		// Forms only from this page: a browser sends Origin on cross-site POSTs.
		if o := r.Header.Get("Origin"); o != "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				http.Error(w, "cross-origin request refused", http.StatusForbidden)
				return
			}
		}
	}
	if r.URL.Path == "/login" {
		h.mux.ServeHTTP(w, r)
		return
	}
	c, err := r.Cookie(CookieName)
	var sess session
	if err == nil {
		sess.id, sess.sid, sess.expiry, err = h.sessions.verify(c.Value)
	}
	if err == nil {
		// The role is the account's as it is now, not the cookie's: a session of an
		// account that is gone is no session.
		var ok bool
		if sess.id.Role, ok = h.authz.Operators().Role(sess.id.Name); !ok {
			err = errSession
		}
	}
	if err != nil {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, "login.html", map[string]any{"Next": safeNext(r.URL.RequestURI())})
		return
	}
	h.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, sess)))
}

// me is the signed-in operator of r (zero when none).
func me(r *http.Request) identity.Identity {
	sess, _ := r.Context().Value(sessionKey{}).(session)
	return sess.id
}

// allow is the identity policy's decision on method for the signed-in operator; the
// returned context carries the identity, as the interceptor's does for a gRPC caller.
func (h *Handler) allow(r *http.Request, method string) (context.Context, error) {
	sess, ok := r.Context().Value(sessionKey{}).(session)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "not signed in")
	}
	return h.authz.Allow(r.Context(), sess.id, method)
}

// safeNext returns next when it is a path on this site, else "/": a sign-in never sends
// the browser to another host (no scheme, no host, no "//" or backslash that a browser
// would read as one).
func safeNext(next string) string {
	if next == "" || next[0] != '/' || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\x00\r\n\t") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	if un, err := url.PathUnescape(u.EscapedPath()); err != nil || strings.ContainsAny(un, "\\") || strings.HasPrefix(un, "//") {
		return "/"
	}
	return next
}

func (h *Handler) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := tmpl.ExecuteTemplate(w, name, data); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (h *Handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	switch status.Code(err) {
	case codes.NotFound:
		code = http.StatusNotFound
	case codes.Unauthenticated:
		code = http.StatusUnauthorized
	case codes.PermissionDenied:
		code = http.StatusForbidden
	case codes.InvalidArgument, codes.FailedPrecondition:
		code = http.StatusBadRequest
	case codes.Aborted:
		code = http.StatusConflict
	case codes.ResourceExhausted:
		code = http.StatusTooManyRequests
	}
	w.WriteHeader(code)
	h.render(w, "error.html", map[string]any{"Error": status.Convert(err).Message()})
}

func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, "login.html", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	id, err := h.authz.Operators().Verify(r.Context(), r.RemoteAddr, r.PostFormValue("token"))
	if err != nil {
		msg := "wrong token"
		code := http.StatusUnauthorized
		if status.Code(err) == codes.ResourceExhausted {
			msg, code = status.Convert(err).Message(), http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		h.render(w, "login.html", map[string]any{"Next": next, "Error": msg})
		return
	}
	v, exp, err := h.sessions.issue(id.Name)
	if err != nil {
		http.Error(w, "session: "+err.Error(), http.StatusInternalServerError)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: v, Path: "/", Expires: exp, MaxAge: int(time.Until(exp).Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	h.log.Info("operator signed in", "operator", id.Name, "source", r.RemoteAddr, "expires", exp.UTC().Format(time.RFC3339))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if sess, ok := r.Context().Value(sessionKey{}).(session); ok {
		h.sessions.revoke(sess.sid, sess.expiry)
		h.log.Info("operator signed out", "operator", sess.id.Name, "source", r.RemoteAddr)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (h *Handler) queue(w http.ResponseWriter, r *http.Request) {
	c, err := h.allow(r, handoffv1.CoordinatorService_ListEscalations_FullMethodName)
	if err != nil {
		h.fail(w, err)
		return
	}
	resp, err := h.srv.ListEscalations(c, &handoffv1.ListEscalationsRequest{PageSize: 200})
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, "queue.html", map[string]any{"Jobs": resp.GetJobs(), "Me": me(r)})
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request) {
	c, err := h.allow(r, handoffv1.CoordinatorService_GetJob_FullMethodName)
	if err != nil {
		h.fail(w, err)
		return
	}
	resp, err := h.srv.GetJob(c, &handoffv1.GetJobRequest{RunId: r.PathValue("run")})
	if err != nil {
		h.fail(w, err)
		return
	}
	job := resp.GetJob()
	art, data, aerr := h.srv.Proposed(c, job)
	d := map[string]any{
		"Job": job, "Timeline": resp.GetTimeline(), "Artifact": art, "Text": string(data), "Stages": h.srv.Stages(job.GetPipeline()),
		"Escalated": job.GetState() == handoffv1.JobState_JOB_STATE_ESCALATED,
		"MaxGrant":  h.srv.MaxGrant(job.GetPipeline()),
		"Me":        me(r), "Resolver": me(r).Role == identity.RoleResolver,
		"Done": r.URL.Query().Get("done"), "Duplicate": r.URL.Query().Get("dup") == "1",
	}
	if aerr != nil {
		d["ArtifactError"] = aerr.Error()
	}
	// The five questions per hop (ExplainJob: GetJob's callers, from the same events).
	if ex, err := h.srv.ExplainJob(c, &handoffv1.ExplainJobRequest{RunId: job.GetRunId()}); err == nil {
		d["Explanation"] = ex.GetExplanation()
	}
	if dl, err := h.srv.Delivery(c, job); err == nil && dl != nil {
		d["Delivery"] = dl
	}
	if err := h.srv.Approvable(job); err != nil {
		d["NoApprove"] = status.Convert(err).Message()
	}
	h.render(w, "job.html", d)
}

func (h *Handler) resolve(w http.ResponseWriter, r *http.Request) {
	c, err := h.allow(r, handoffv1.CoordinatorService_ResolveEscalation_FullMethodName)
	if err != nil {
		h.fail(w, err)
		return
	}
	runID := r.PathValue("run")
	for _, f := range []string{"comment", "reason", "stage", "artifact_text", "escalation", "grant_hops", "grant_revisions", "grant_usd_micros"} {
		if !utf8.ValidString(r.PostFormValue(f)) {
			w.WriteHeader(http.StatusBadRequest)
			h.render(w, "error.html", map[string]any{"Error": fmt.Sprintf("%s: invalid UTF-8", f)})
			return
		}
	}
	esc, err := strconv.ParseUint(r.PostFormValue("escalation"), 10, 32)
	if err != nil || esc == 0 {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, "error.html", map[string]any{"Error": fmt.Sprintf("escalation %q: want the number of the escalation decided (reload the page)", r.PostFormValue("escalation"))})
		return
	}
	// Who decided is the signed-in account, never a typed name.
	req := &handoffv1.ResolveEscalationRequest{RunId: runID, Operator: me(r).Name, Comment: r.PostFormValue("comment"), Escalation: uint32(esc), Override: r.PostFormValue("override") == "1"}
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
		g, err := grantOf(r)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			h.render(w, "error.html", map[string]any{"Error": err.Error()})
			return
		}
		req.Action = &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: r.PostFormValue("stage"), ArtifactText: edit, Grant: g}}
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

// grantOf reads the return form's grant: empty fields are 0; nil when nothing is given.
func grantOf(r *http.Request) (*handoffv1.Grant, error) {
	var n [3]uint64
	for i, f := range []string{"grant_hops", "grant_revisions", "grant_usd_micros"} {
		v := strings.TrimSpace(r.PostFormValue(f))
		if v == "" {
			continue
		}
		var err error
		if n[i], err = strconv.ParseUint(v, 10, 63); err != nil {
			return nil, fmt.Errorf("%s %q: want a whole number, 0 or more", f, v)
		}
	}
	if n[0] > 1000 || n[1] > 100 {
		return nil, fmt.Errorf("grant of %d hops, %d revisions: a wallet holds at most 1000 hops and 100 revisions", n[0], n[1])
	}
	if n == [3]uint64{} {
		return nil, nil
	}
	return &handoffv1.Grant{Hops: uint32(n[0]), Revisions: uint32(n[1]), UsdMicros: int64(n[2])}, nil
}

// claim claims the run's escalation for the signed-in operator, or releases its claim.
func (h *Handler) claim(w http.ResponseWriter, r *http.Request) {
	c, err := h.allow(r, handoffv1.CoordinatorService_ClaimEscalation_FullMethodName)
	if err != nil {
		h.fail(w, err)
		return
	}
	runID := r.PathValue("run")
	esc, err := strconv.ParseUint(r.PostFormValue("escalation"), 10, 32)
	if err != nil || esc == 0 {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, "error.html", map[string]any{"Error": fmt.Sprintf("escalation %q: want the number of the escalation claimed (reload the page)", r.PostFormValue("escalation"))})
		return
	}
	if _, err := h.srv.ClaimEscalation(c, &handoffv1.ClaimEscalationRequest{RunId: runID, Escalation: uint32(esc), Release: r.PostFormValue("release") == "1"}); err != nil {
		h.fail(w, err)
		return
	}
	http.Redirect(w, r, "/jobs/"+url.PathEscape(runID), http.StatusSeeOther)
}
