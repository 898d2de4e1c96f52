package identity

import (
	"log/slog"
	"slices"
	"time"
)

// Option configures the interceptors.
type Option func(*options)

type options struct {
	policy       Policy
	verifier     *Verifier
	operators    *Operators
	defaultAllow []string
	logger       *slog.Logger
	now          func() time.Time
}

// WithPolicy sets the policy (a copy is kept; a later WithPolicy replaces it). Without
// one, every method but health and reflection is open only to WithDefaultAllow.
func WithPolicy(p Policy) Option {
	return func(o *options) { o.policy = p.clone() }
}

// WithVerifier accepts service tokens that v verifies: addressed to v's audience (the
// service this server is) and signed by a caller whose public key v holds. Without it, a
// call that carries a service token and no client certificate is refused.
func WithVerifier(v *Verifier) Option {
	return func(o *options) { o.verifier = v }
}

// WithOperators accepts operator tokens (authorization: Bearer <token>, any bearer value
// that is not a service token) verified by ops, as the identity OperatorService. Without
// it, a call that presents such a token is refused: a credential this server cannot check
// is never ignored.
func WithOperators(ops *Operators) Option {
	return func(o *options) { o.operators = ops }
}

// WithDefaultAllow sets the services allowed to call methods the policy does not match;
// Anyone ("*") opens them to every caller. Default: none, so unlisted methods are denied.
func WithDefaultAllow(services ...string) Option {
	return func(o *options) { o.defaultAllow = slices.Clone(services) }
}

// WithLogger logs every refused call at Warn (method, peer, code, reason). Default: no
// logging; the logging interceptor reports the status anyway.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

func newOptions(opts []Option) *options {
	o := &options{now: time.Now}
	for _, opt := range opts {
		opt(o)
	}
	if err := o.policy.Validate(); err != nil {
		panic(err.Error())
	}
	if err := checkServices(o.defaultAllow); err != nil {
		panic("identity: WithDefaultAllow: " + err.Error())
	}
	return o
}
