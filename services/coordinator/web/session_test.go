package web

import (
	"strings"
	"testing"
	"time"
)

func TestSessionsExpireAndCannotBeAltered(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ss, err := newSessions(time.Hour, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	v, exp, err := ss.issue("ana")
	if err != nil || !exp.Equal(now.Add(time.Hour)) {
		t.Fatalf("issue: %v, expiry %s", err, exp)
	}
	if id, _, _, err := ss.verify(v); err != nil || id.Name != "ana" || id.Service != "operator" {
		t.Fatalf("fresh session: %v %v", id, err)
	}
	parts := strings.Split(v, ".")
	for name, forged := range map[string]string{
		"another name": "Ym8." + strings.Join(parts[1:], "."),
		"later expiry": parts[0] + ".9999999999." + strings.Join(parts[2:], "."),
		"no signature": strings.Join(parts[:3], "."),
		"other key": func() string {
			o, _ := newSessions(time.Hour, func() time.Time { return now })
			s, _, _ := o.issue("ana")
			return s
		}(),
		"empty":         "",
		"garbage parts": "a.b.c.d",
	} {
		if _, _, _, err := ss.verify(forged); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	now = now.Add(time.Hour)
	if _, _, _, err := ss.verify(v); err == nil {
		t.Fatal("a session at its expiry was accepted")
	}
}

func TestSignOutRevokesOnlyThatSession(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ss, _ := newSessions(time.Hour, func() time.Time { return now })
	a, _, _ := ss.issue("ana")
	b, _, _ := ss.issue("ana")
	_, sid, exp, err := ss.verify(a)
	if err != nil {
		t.Fatal(err)
	}
	ss.revoke(sid, exp)
	if _, _, _, err := ss.verify(a); err == nil {
		t.Fatal("a revoked session was accepted")
	}
	if _, _, _, err := ss.verify(b); err != nil {
		t.Fatalf("another session of the same operator was revoked too: %v", err)
	}
	now = now.Add(2 * time.Hour)
	ss.revoke("other", now.Add(time.Hour))
	if _, kept := ss.revoked[sid]; kept {
		t.Fatal("a revoked session past its expiry is still remembered")
	}
}
