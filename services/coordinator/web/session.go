package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// A session cookie is
//
//	base64url(operator name).<unix expiry>.<session id>.base64url(HMAC-SHA256(key, the rest))
//
// signed with a key made when the page starts: it never holds the operator token, it ends
// at its expiry, and a restart of the page ends every session. Sign-out revokes the id
// until the session would have expired anyway.
type sessions struct {
	key []byte
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	revoked map[string]time.Time // session id -> its expiry
}

var errSession = errors.New("no valid session")

func newSessions(ttl time.Duration, now func() time.Time) (*sessions, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &sessions{key: key, ttl: ttl, now: now, revoked: map[string]time.Time{}}, nil
}

func (s *sessions) mac(payload string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// issue returns a signed session for operator name and when it expires.
func (s *sessions) issue(name string) (string, time.Time, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return "", time.Time{}, err
	}
	exp := s.now().Add(s.ttl).Truncate(time.Second)
	payload := base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + strconv.FormatInt(exp.Unix(), 10) + "." + hex.EncodeToString(id)
	return payload + "." + s.mac(payload), exp, nil
}

// verify checks a session value and returns the operator it names and its id and expiry.
func (s *sessions) verify(v string) (identity.Identity, string, time.Time, error) {
	parts := strings.Split(v, ".")
	if len(v) > 512 || len(parts) != 4 {
		return identity.Identity{}, "", time.Time{}, errSession
	}
	payload := strings.Join(parts[:3], ".")
	if !hmac.Equal([]byte(parts[3]), []byte(s.mac(payload))) {
		return identity.Identity{}, "", time.Time{}, errSession
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[0])
	unix, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || err2 != nil {
		return identity.Identity{}, "", time.Time{}, errSession
	}
	exp := time.Unix(unix, 0)
	if !s.now().Before(exp) {
		return identity.Identity{}, "", time.Time{}, errSession
	}
	s.mu.Lock()
	_, gone := s.revoked[parts[2]]
	s.mu.Unlock()
	if gone {
		return identity.Identity{}, "", time.Time{}, errSession
	}
	return identity.Identity{Service: identity.OperatorService, Method: methodSession, Name: string(name)}, parts[2], exp, nil
}

// revoke ends session id (which expires at exp) before its expiry, and forgets revoked
// sessions that have expired by now.
func (s *sessions) revoke(id string, exp time.Time) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.revoked {
		if !now.Before(e) {
			delete(s.revoked, k)
		}
	}
	s.revoked[id] = exp
}

// methodSession is Identity.Method for an operator signed in to the page.
const methodSession = "web-session"
