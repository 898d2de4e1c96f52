package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/store"
)

// Defaults of the shared options.
const (
	// DefaultPendingTTL is how long an in-flight claim blocks repeats of its key.
	DefaultPendingTTL = 2 * time.Minute
	// DefaultRetryDelay is the delay an Aborted (in flight) answer suggests in its RetryInfo.
	DefaultRetryDelay = time.Second
)

// Option configures UnaryServerInterceptor. WithKey and WithReplay are Options; the shared
// options (WithPendingTTL, WithResultTTL, WithRetryDelay, WithLogger) are both Options and
// StreamOptions.
type Option interface{ applyUnary(*unaryConfig) }

// StreamOption configures StreamServerInterceptor. WithStreamKey, WithStreamReplay and
// WithStreamRecord are StreamOptions; so are the shared options.
type StreamOption interface{ applyStream(*streamConfig) }

// SharedOption configures either interceptor: it is an Option and a StreamOption.
type SharedOption struct{ apply func(*common) }

func (o SharedOption) applyUnary(c *unaryConfig)   { o.apply(&c.common) }
func (o SharedOption) applyStream(c *streamConfig) { o.apply(&c.common) }

type unaryOption func(*unaryConfig)

func (f unaryOption) applyUnary(c *unaryConfig) { f(c) }

type streamOption func(*streamConfig)

func (f streamOption) applyStream(c *streamConfig) { f(c) }

// common is what both interceptors are configured with.
type common struct {
	pendingTTL time.Duration
	renewFor   time.Duration // > 0: renew the claim while the handler runs, for at most this long
	resultTTL  time.Duration
	retryDelay time.Duration
	log        *slog.Logger
}

func defaultCommon() common {
	return common{pendingTTL: DefaultPendingTTL, retryDelay: DefaultRetryDelay}
}

func (c *common) check() {
	if c.pendingTTL <= 0 {
		panic(fmt.Sprintf("idempotency: WithPendingTTL(%s): the pending TTL must be positive", c.pendingTTL))
	}
	if c.resultTTL < 0 {
		panic(fmt.Sprintf("idempotency: WithResultTTL(%s): must not be negative (0 keeps results forever)", c.resultTTL))
	}
	if c.retryDelay < 0 {
		panic(fmt.Sprintf("idempotency: WithRetryDelay(%s): must not be negative", c.retryDelay))
	}
	if c.renewFor < 0 {
		panic(fmt.Sprintf("idempotency: WithClaimRenewal(%s): must not be negative", c.renewFor))
	}
	if c.log == nil {
		c.log = slog.Default()
	}
}

// WithPendingTTL sets how long an in-flight claim blocks repeats of its key (they get
// Aborted with RetryInfo); default DefaultPendingTTL. It must be positive.
//
// After it lapses, a claim whose holder died (a crashed process) can be taken again, so it
// must exceed the handler's worst-case running time. The interceptor enforces that from its
// side: the handler runs under a deadline of pendingTTL/2, so the claim never lapses while
// its handler still runs.
func WithPendingTTL(d time.Duration) SharedOption {
	return SharedOption{func(c *common) { c.pendingTTL = d }}
}

// WithClaimRenewal keeps a short pending TTL safe for long handlers: while a handler runs,
// its claim is renewed (store.Idempotency.RenewClaim) every pendingTTL/3, and the handler
// runs under a deadline of work instead of pendingTTL/2. A holder that dies stops renewing,
// so its claim lapses within pendingTTL and a repeat runs on another server, instead of
// waiting out a TTL sized for the slowest handler. When a renewal finds the key no longer
// pending, or none succeeds for pendingTTL/2 (from then on another caller may soon claim
// the key), the handler's context is cancelled: two holders never run on at once. Each
// claim in flight costs the store one renewal per pendingTTL/3 (one Redis command).
func WithClaimRenewal(work time.Duration) SharedOption {
	return SharedOption{func(c *common) { c.renewFor = work }}
}

// WithResultTTL sets how long a completed result answers repeats of its key; default 0,
// which keeps results forever. A repeat that arrives after the result expired is a new
// request: it runs the handler again (a second external write), so set it longer than any
// retry or redelivery horizon of the callers.
func WithResultTTL(d time.Duration) SharedOption {
	return SharedOption{func(c *common) { c.resultTTL = d }}
}

// WithRetryDelay sets the delay that an Aborted "in flight" answer suggests in its
// google.rpc.RetryInfo detail and message; default DefaultRetryDelay.
func WithRetryDelay(d time.Duration) SharedOption {
	return SharedOption{func(c *common) { c.retryDelay = d }}
}

// WithLogger sets where store failures (claim, complete, release) and handler panics are
// logged; default slog.Default().
func WithLogger(l *slog.Logger) SharedOption {
	return SharedOption{func(c *common) { c.log = l }}
}

// ---- unary ----

type unaryMethod struct {
	newResp func() proto.Message
	key     func(req proto.Message) (string, error)
	replay  func(stored proto.Message)
}

type unaryConfig struct {
	common
	methods map[string]*unaryMethod
	replays map[string]func(stored proto.Message)
}

// WithKey makes the unary method fullMethod ("/handoff.v1.WritebackService/Write")
// idempotent on key(req). Methods without a key function pass through untouched.
//
// newResp returns an empty response of the method's type; a replayed answer is the stored
// result unmarshalled into it. nil looks the type up in the global protobuf registry from
// fullMethod (it panics when the method is not registered there); when the method is
// registered, a newResp that makes another type panics too.
//
// key must be deterministic for a logical request and never contain the attempt; keys must
// be unique across all methods that share a store (prefix them per method). An error from
// key, or an empty key, answers InvalidArgument and nothing is claimed.
func WithKey(fullMethod string, newResp func() proto.Message, key func(req proto.Message) (string, error)) Option {
	return unaryOption(func(c *unaryConfig) {
		if key == nil {
			panic(fmt.Sprintf("idempotency: WithKey(%q): key function is nil", fullMethod))
		}
		if _, dup := c.methods[fullMethod]; dup {
			panic(fmt.Sprintf("idempotency: WithKey(%q) given twice", fullMethod))
		}
		site := hop.Site{Pkg: "idempotency", Opt: "WithKey", FullMethod: fullMethod}
		var out protoreflect.MessageDescriptor
		if md := site.Lookup(); md != nil {
			if md.IsStreamingClient() || md.IsStreamingServer() {
				panic(fmt.Sprintf("idempotency: WithKey(%q): the method is streaming; use StreamServerInterceptor and WithStreamKey", fullMethod))
			}
			out = md.Output()
		}
		newResp = site.Factory("newResp", "message", newResp, out)
		c.methods[fullMethod] = &unaryMethod{newResp: newResp, key: key}
	})
}

// WithReplay sets a hook that adjusts a replayed answer of fullMethod before it is returned:
// stored is the first call's response, freshly unmarshalled (e.g. set
// WriteResponse.duplicate = true). The method needs a WithKey.
func WithReplay(fullMethod string, fn func(stored proto.Message)) Option {
	return unaryOption(func(c *unaryConfig) {
		if fn == nil {
			panic(fmt.Sprintf("idempotency: WithReplay(%q): function is nil", fullMethod))
		}
		c.replays[fullMethod] = fn
	})
}

func newUnaryConfig(opts []Option) *unaryConfig {
	c := &unaryConfig{
		common:  defaultCommon(),
		methods: map[string]*unaryMethod{},
		replays: map[string]func(proto.Message){},
	}
	for _, o := range opts {
		if o != nil {
			o.applyUnary(c)
		}
	}
	c.check()
	for name, fn := range c.replays {
		m, ok := c.methods[name]
		if !ok {
			panic(fmt.Sprintf("idempotency: WithReplay(%q) without WithKey for the method", name))
		}
		m.replay = fn
	}
	return c
}

// ---- stream ----

type streamMethod struct {
	newReq func() proto.Message
	key    func(req proto.Message) (string, error)
	replay func(req proto.Message, stored []byte) (proto.Message, error)
	record func(ctx context.Context, req proto.Message, sent proto.Message) (value []byte, done bool, failed bool)
	claim  ClaimFunc
	// afterSend: a done message is sent before it is stored (WithStreamRecordAfterSend).
	afterSend bool
}

// ClaimFunc claims key for req in place of the store's Claim (see WithStreamClaim). ctx is
// detached from the caller and bounded like every store call. owner is the claim's owner
// token when state is Claimed (store.Admission.Owner), which the key's Complete, Release
// and renewals name. annotate, when not nil, is applied to the context the handler (and the
// record hook) runs under, so the claim can pass on what it learned in the same round trip.
type ClaimFunc func(ctx context.Context, req proto.Message, key string, pendingTTL time.Duration) (state store.ClaimState, value []byte, owner string, annotate func(context.Context) context.Context, err error)

type streamConfig struct {
	common
	methods map[string]*streamMethod
}

func (c *streamConfig) method(name string) *streamMethod {
	m, ok := c.methods[name]
	if !ok {
		m = &streamMethod{}
		c.methods[name] = m
	}
	return m
}

// WithStreamKey makes the server-streaming method fullMethod
// ("/handoff.v1.AgentRunnerService/Deliver") idempotent on key(req). The interceptor reads
// the request itself into newReq() (nil looks the request type up in the global protobuf
// registry). The method also needs WithStreamReplay and WithStreamRecord. Methods without a
// key function pass through untouched. key is as for WithKey.
func WithStreamKey(fullMethod string, newReq func() proto.Message, key func(req proto.Message) (string, error)) StreamOption {
	return streamOption(func(c *streamConfig) {
		if key == nil {
			panic(fmt.Sprintf("idempotency: WithStreamKey(%q): key function is nil", fullMethod))
		}
		m := c.method(fullMethod)
		if m.key != nil {
			panic(fmt.Sprintf("idempotency: WithStreamKey(%q) given twice", fullMethod))
		}
		site := hop.Site{Pkg: "idempotency", Opt: "WithStreamKey", FullMethod: fullMethod}
		var in protoreflect.MessageDescriptor
		if md := site.Lookup(); md != nil {
			if md.IsStreamingClient() || !md.IsStreamingServer() {
				panic(fmt.Sprintf("idempotency: WithStreamKey(%q): only server-streaming methods (one request, a stream of answers) can be keyed", fullMethod))
			}
			in = md.Input()
		}
		newReq = site.Factory("newReq", "message", newReq, in)
		m.newReq, m.key = newReq, key
	})
}

// WithStreamReplay sets how a repeat of fullMethod is answered when its key is done: fn
// builds the one message sent (e.g. a DUPLICATE Ack carrying the stored PriorResult) from
// the request and the stored value; the handler is not called and the stream then ends. An
// error from fn is returned to the caller (as Internal unless it is a gRPC status).
func WithStreamReplay(fullMethod string, fn func(req proto.Message, stored []byte) (proto.Message, error)) StreamOption {
	return streamOption(func(c *streamConfig) {
		if fn == nil {
			panic(fmt.Sprintf("idempotency: WithStreamReplay(%q): function is nil", fullMethod))
		}
		c.method(fullMethod).replay = fn
	})
}

// WithStreamClaim makes fn claim the keys of fullMethod instead of the store's Claim, so a
// service can do more in the same store round trip: the agent runner admits a hop with
// store.Admitter, which claims the key and debits the job's wallet together. fn must
// behave like Claim (the same states, Pending and Done not taking the key); an error is
// Unavailable, as for Claim.
func WithStreamClaim(fullMethod string, fn ClaimFunc) StreamOption {
	return streamOption(func(c *streamConfig) {
		if fn == nil {
			panic(fmt.Sprintf("idempotency: WithStreamClaim(%q): function is nil", fullMethod))
		}
		c.method(fullMethod).claim = fn
	})
}

// WithStreamRecord sets how the messages the handler of fullMethod sends settle its key. fn
// is called with the request for every message the handler sends, before it is sent:
//
//   - done: value is stored under the key (Complete) before the message goes out, so a
//     caller that has seen it and retries gets the replay (after it, with
//     WithStreamRecordAfterSend). done wins over failed.
//   - failed: the key is released before the message goes out, so a retry runs again.
//   - neither: nothing happens (an ACCEPTED ack, progress).
//
// Only the first done or failed settles the key; later ones are ignored. A handler that
// returns before either has its key released.
//
// ctx is the handler's context (detached from the caller, with what a WithStreamClaim
// function added).
func WithStreamRecord(fullMethod string, fn func(ctx context.Context, req proto.Message, sent proto.Message) (value []byte, done bool, failed bool)) StreamOption {
	return streamOption(func(c *streamConfig) {
		if fn == nil {
			panic(fmt.Sprintf("idempotency: WithStreamRecord(%q): function is nil", fullMethod))
		}
		c.method(fullMethod).record = fn
	})
}

// WithStreamRecordAfterSend makes a done message of fullMethod go out before its value is
// stored rather than after, so the store write overlaps what the caller does with it
// instead of delaying it by a round trip. Use it only when the caller keeps the result
// durably itself before acting on it (the coordinator saves its run): a result that was
// sent but could not be stored then loses nothing, since the caller does not ask again.
// A caller that does repeat the request before the store write lands gets Aborted (in
// flight) and the replay on its retry; when the write fails the call ends with Unavailable
// after the message, and the key stays claimed, as without this option. A failed message
// still releases the key before it is sent.
func WithStreamRecordAfterSend(fullMethod string) StreamOption {
	return streamOption(func(c *streamConfig) {
		c.method(fullMethod).afterSend = true
	})
}

func newStreamConfig(opts []StreamOption) *streamConfig {
	c := &streamConfig{common: defaultCommon(), methods: map[string]*streamMethod{}}
	for _, o := range opts {
		if o != nil {
			o.applyStream(c)
		}
	}
	c.check()
	for name, m := range c.methods {
		switch {
		case m.key == nil:
			panic(fmt.Sprintf("idempotency: WithStreamReplay/WithStreamRecord/WithStreamClaim(%q) without WithStreamKey", name))
		case m.replay == nil:
			panic(fmt.Sprintf("idempotency: WithStreamKey(%q) needs WithStreamReplay", name))
		case m.record == nil:
			panic(fmt.Sprintf("idempotency: WithStreamKey(%q) needs WithStreamRecord", name))
		}
	}
	return c
}
