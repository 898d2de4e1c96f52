package pii

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// RefKind is the kind of the memory refs a Vault answers: "pii:<id>".
const RefKind = "pii"

// ErrNotFound is Vault.Get's error for a ref it does not hold.
var ErrNotFound = errors.New("pii: no such ref")

// Vault keeps redacted values apart from the run state, in a folder only the coordinator's
// user can read (0700, files 0600): one file per value, written and synced before its ref is
// used, so a ref in a stored run always resolves after a crash. The store (bbolt, Redis) and
// the events never see the value.
//
// A ref's id is an HMAC of the job and the value under a key the vault makes on first use
// (the file "key"), so the same value in the same job always gets the same ref (a job
// submitted again is the same job), while the id says nothing about the value to whoever
// lacks the key: a card number's few unknown digits cannot be guessed from it. Ids use
// letters only, so a ref never looks like a number to the detectors.
type Vault struct {
	dir string
	key []byte
}

// entry is a value's file.
type entry struct {
	JobID string `json:"job_id"`
	Kind  string `json:"kind"`
	Value string `json:"value"`
}

// OpenVault opens (creating it when missing) the vault in dir.
func OpenVault(dir string) (*Vault, error) {
	if strings.TrimSpace(dir) == "" {
		return nil, errors.New("pii: vault folder is empty")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pii: vault folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pii: vault folder: %w", err)
	}
	kp := filepath.Join(dir, "key")
	key, err := os.ReadFile(kp)
	switch {
	case errors.Is(err, os.ErrNotExist):
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("pii: vault key: %w", err)
		}
		if err := writeSynced(dir, "key", key); err != nil {
			return nil, fmt.Errorf("pii: vault key: %w", err)
		}
		// Two openers racing: the key that landed wins, for both.
		if key, err = os.ReadFile(kp); err != nil {
			return nil, fmt.Errorf("pii: vault key: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("pii: vault key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("pii: vault key %s is %d bytes, not 32: the vault folder is damaged", kp, len(key))
	}
	return &Vault{dir: dir, key: key}, nil
}

// Dir is the vault's folder.
func (v *Vault) Dir() string { return v.dir }

func (v *Vault) id(jobID, value string) string {
	m := hmac.New(sha256.New, v.key)
	m.Write([]byte(jobID))
	m.Write([]byte{0})
	m.Write([]byte(value))
	sum := m.Sum(nil)
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 24)
	for i := range b {
		b[i] = letters[int(sum[i])%len(letters)]
	}
	return string(b)
}

// Keep stores value of job jobID and returns its ref ("pii:<id>"). Keeping the same value
// of the same job again answers the same ref and writes nothing.
func (v *Vault) Keep(ctx context.Context, jobID, kind, value string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	id := v.id(jobID, value)
	if _, err := os.Stat(filepath.Join(v.dir, id)); err == nil {
		return RefKind + ":" + id, nil
	}
	b, err := json.Marshal(entry{JobID: jobID, Kind: kind, Value: value})
	if err != nil {
		return "", err
	}
	if err := writeSynced(v.dir, id, b); err != nil {
		return "", fmt.Errorf("writing ref %s: %w", id, err)
	}
	return RefKind + ":" + id, nil
}

// Get returns the value behind ref and the job it belongs to. It is a Go call of the
// coordinator's process and of its host's operator, who alone can read the folder: no RPC
// answers it.
func (v *Vault) Get(ref string) (jobID, kind, value string, err error) {
	id, ok := strings.CutPrefix(ref, RefKind+":")
	if !ok || len(id) != 24 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz") != "" {
		return "", "", "", fmt.Errorf("pii: %q is not a %s ref", ref, RefKind)
	}
	b, err := os.ReadFile(filepath.Join(v.dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return "", "", "", ErrNotFound
	}
	if err != nil {
		return "", "", "", err
	}
	var e entry
	if err := json.Unmarshal(b, &e); err != nil {
		return "", "", "", fmt.Errorf("pii: ref %s: damaged entry", id)
	}
	return e.JobID, e.Kind, e.Value, nil
}

// writeSynced writes name in dir through a synced temporary file and a rename, then syncs
// the folder, so the file is either whole or absent after a crash. An existing name is
// kept (the first writer wins).
func writeSynced(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
