package identity

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// OperatorService is the identity of a person: the service name an operator's certificate
// carries and the one an operator token establishes. Policies name it like a service.
const OperatorService = "operator"

// MethodOperatorToken is Identity.Method for a caller that presented an operator token.
const MethodOperatorToken = "operator-token"

// MinOperatorTokenLen is the shortest operator token NewOperators accepts: a token guards
// approvals of external writes, so a short guessable one is refused at start-up.
const MinOperatorTokenLen = 16

// Defaults of the failure limit: each source may fail this many times in a row before it
// must wait, and earns one more try per failureRefill.
const (
	failureBurst  = 5
	failureRefill = 12 * time.Second
	// maxSources bounds the memory of the limiter; past it, sources that are back to a
	// full allowance are forgotten, and new ones share one allowance while none is.
	maxSources = 10_000
)

// ErrTooManyFailures is returned (wrapped in a ResourceExhausted status) when a source has
// failed too often; it must wait before it may try again, even with the right token.
var ErrTooManyFailures = errors.New("too many failed operator credentials from this address")

// Operator roles: a viewer reads jobs and the escalation queue; a resolver also decides.
const (
	RoleViewer   = "viewer"
	RoleResolver = "resolver"
)

// OperatorResolver is the policy value for an operator whose role is resolver (an account
// of that role, or an operator certificate or operator-key service token, which are not
// accounts and act as resolvers).
const OperatorResolver = OperatorService + ":" + RoleResolver

// Account is one operator: a person's name recorded with what they do, their role, and
// their token, given either as the token itself (Token) or only as its SHA-256 in hex
// (TokenSHA256, what an accounts file holds: the file never has the token).
type Account struct {
	Name        string
	Role        string
	Token       string
	TokenSHA256 string
}

// TokenAccount is the account a single operator token (--operator-token,
// HANDOFF_OPERATOR_TOKEN) stands for: "operator", a resolver.
func TokenAccount(tok string) Account {
	return Account{Name: OperatorService, Role: RoleResolver, Token: tok}
}

type account struct {
	name, role string
	hash       [sha256.Size]byte
}

// Operators verifies operator tokens (bearer tokens that are not service tokens), for the
// gRPC interceptor and the operator page alike. Only hashes of the tokens are kept. Failed
// attempts are counted per source address and logged without the token; a source past its
// allowance is refused for a while. Safe for concurrent use.
type Operators struct {
	accounts []account
	log      *slog.Logger
	now      func() time.Time

	mu      sync.Mutex
	sources map[string]*source
}

// NewOperators returns a verifier for accounts (at least one). Each token must be at least
// MinOperatorTokenLen bytes, and names and tokens must be distinct.
func NewOperators(log *slog.Logger, accounts ...Account) (*Operators, error) {
	if len(accounts) == 0 {
		return nil, errors.New("identity: no operator accounts")
	}
	if log == nil {
		log = slog.Default()
	}
	o := &Operators{log: log, now: time.Now, sources: map[string]*source{}}
	names := map[string]bool{}
	hashes := map[[sha256.Size]byte]bool{}
	for i, a := range accounts {
		if a.Name == "" {
			return nil, fmt.Errorf("identity: operator account %d has no name", i)
		}
		if !validService(a.Name) {
			return nil, fmt.Errorf("identity: operator account name %q: use lowercase letters, digits and '-' (a login)", a.Name)
		}
		if a.Role != RoleViewer && a.Role != RoleResolver {
			return nil, fmt.Errorf("identity: operator %q: role %q: want %s or %s", a.Name, a.Role, RoleViewer, RoleResolver)
		}
		var h [sha256.Size]byte
		switch {
		case a.Token != "" && a.TokenSHA256 != "":
			return nil, fmt.Errorf("identity: operator %q: give the token or its sha256, not both", a.Name)
		case a.TokenSHA256 != "":
			b, err := hex.DecodeString(a.TokenSHA256)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("identity: operator %q: token_sha256 must be 64 hex digits (the SHA-256 of the token)", a.Name)
			}
			copy(h[:], b)
		default:
			if len(a.Token) < MinOperatorTokenLen {
				return nil, fmt.Errorf("identity: operator %q: token is %d bytes, need at least %d", a.Name, len(a.Token), MinOperatorTokenLen)
			}
			if tokenScheme.MatchString(a.Token) {
				return nil, fmt.Errorf("identity: operator %q: token looks like a service token (hstN.); choose another", a.Name)
			}
			h = sha256.Sum256([]byte(a.Token))
		}
		if names[a.Name] || hashes[h] {
			return nil, fmt.Errorf("identity: operator %q: name or token used twice", a.Name)
		}
		names[a.Name], hashes[h] = true, true
		o.accounts = append(o.accounts, account{name: a.Name, role: a.Role, hash: h})
	}
	return o, nil
}

// Verify checks an operator token presented from source (a host, or host:port, of the
// caller) and returns the operator's identity. A wrong token is Unauthenticated; a source
// over its failure allowance is ResourceExhausted whatever it presents. Refusals are logged
// with the source and the reason, never the token; while a source stays locked out only its
// first refusal is logged, so a flood of guesses is not a flood of log lines.
func (o *Operators) Verify(ctx context.Context, source, tok string) (Identity, error) {
	src := sourceHost(source)
	// The try is taken before the comparison, so concurrent guesses cannot all pass the
	// check of a source that has one try left; a success gives it back.
	ok, warn := o.take(src)
	if !ok {
		if warn {
			o.log.WarnContext(ctx, "identity: operator credential refused", "source", src, "reason", "too many failures; further refusals of this source are not logged until it may try again")
		}
		return Identity{}, status.Errorf(codes.ResourceExhausted, "%v; wait %s and try again", ErrTooManyFailures, failureRefill)
	}
	h := sha256.Sum256([]byte(tok))
	var found *account
	for i := range o.accounts {
		// Every account is compared, so the time taken does not say which one matched.
		if subtle.ConstantTimeCompare(h[:], o.accounts[i].hash[:]) == 1 {
			found = &o.accounts[i]
		}
	}
	if found != nil {
		o.succeeded(src)
		return Identity{Service: OperatorService, Method: MethodOperatorToken, Name: found.name, Role: found.role}, nil
	}
	o.log.WarnContext(ctx, "identity: operator credential refused", "source", src, "reason", "unknown operator token")
	return Identity{}, status.Error(codes.Unauthenticated, "operator token not recognised")
}

// Role returns the role of account name, and false when there is no such account (a
// session of an account that is gone is no session).
func (o *Operators) Role(name string) (string, bool) {
	for _, a := range o.accounts {
		if a.name == name {
			return a.role, true
		}
	}
	return "", false
}

// ParseAccounts reads operator accounts, one a line: "name role sha256-of-token", where
// role is viewer or resolver and the token appears only as its SHA-256 in hex (printf %s
// "$TOKEN" | sha256sum). Blank lines and lines starting with # are skipped; in an
// environment variable, ';' separates lines too. what names the source in errors.
func ParseAccounts(what, text string) ([]Account, error) {
	var out []Account
	for i, line := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ';' }) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s: entry %d %q: want \"name role sha256-of-token\" (role viewer or resolver)", what, i+1, line)
		}
		if f[1] != RoleViewer && f[1] != RoleResolver {
			return nil, fmt.Errorf("%s: entry %d (%s): role %q: want %s or %s", what, i+1, f[0], f[1], RoleViewer, RoleResolver)
		}
		out = append(out, Account{Name: f[0], Role: f[1], TokenSHA256: strings.ToLower(f[2])})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no operator accounts", what)
	}
	return out, nil
}

// LoadAccounts reads operator accounts (ParseAccounts) from file, when set, and from
// inline, when set (the text of an environment variable such as HANDOFF_OPERATORS).
func LoadAccounts(file, inline string) ([]Account, error) {
	var out []Account
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("operator accounts: %w", err)
		}
		a, err := ParseAccounts(file, string(data))
		if err != nil {
			return nil, err
		}
		out = append(out, a...)
	}
	if inline != "" {
		a, err := ParseAccounts("operator accounts", inline)
		if err != nil {
			return nil, err
		}
		out = append(out, a...)
	}
	return out, nil
}

// AccountsHelp describes the accounts format for --help texts.
const AccountsHelp = "operator accounts, one a line (or separated by ';'): \"name role sha256-of-token\", role viewer (reads) or resolver (decides); the token appears only as its SHA-256 (printf %s \"$TOKEN\" | sha256sum)"

// source is one address's allowance of failures.
type source struct {
	lim *rate.Limiter
	// warned is set once a lockout of this source has been logged.
	warned bool
}

// overflow is the allowance shared by every new source once the table is full of sources
// still failing: a caller spraying from many addresses gets no fresh allowance per address.
const overflow = ""

// take spends one try of src's allowance. ok is false when none is left; warn is true for
// the first such refusal of a lockout.
func (o *Operators) take(src string) (ok, warn bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	s := o.sourceLocked(src, now)
	if s.lim.AllowN(now, 1) {
		s.warned = false
		return true, false
	}
	warn = !s.warned
	s.warned = true
	return false, warn
}

func (o *Operators) sourceLocked(src string, now time.Time) *source {
	if s, ok := o.sources[src]; ok {
		return s
	}
	if len(o.sources) >= maxSources {
		for k, s := range o.sources {
			if k != overflow && s.lim.TokensAt(now) >= failureBurst {
				delete(o.sources, k)
			}
		}
		if len(o.sources) >= maxSources {
			src = overflow
			if s, ok := o.sources[src]; ok {
				return s
			}
		}
	}
	s := &source{lim: rate.NewLimiter(rate.Every(failureRefill), failureBurst)}
	o.sources[src] = s
	return s
}

// succeeded forgets src's failures: a person who mistyped once is not held back. (A
// source in the shared overflow allowance leaves it as it is.)
func (o *Operators) succeeded(src string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.sources, src)
}

// sourceHost drops the port of a host:port, so one host's connections share an allowance.
func sourceHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// OperatorCredentials returns client credentials that send tok as the operator token on
// every call (authorization: Bearer <tok>), for a tool acting as an operator (grpcurl's
// -H does the same by hand). Like service tokens it may travel over plaintext only on
// loopback: the server refuses it over plaintext from any other address.
func OperatorCredentials(tok string) credentials.PerRPCCredentials { return operatorCreds(tok) }

type operatorCreds string

func (c operatorCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(c)}, nil
}

func (operatorCreds) RequireTransportSecurity() bool { return false }
