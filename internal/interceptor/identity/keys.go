package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Token keys on disk, as `handoff keys` writes them:
//
//	DIR/<service>.key         the service's Ed25519 private key: PEM "PRIVATE KEY" (PKCS #8), 0600
//	DIR/public/<service>.pub  its public key: PEM "PUBLIC KEY" (PKIX)
//
// A service gets its own .key (--token-key-file) and the public folder (--token-public-keys);
// the public folder holds nothing that can mint a token, and LoadPublicKeys refuses a
// folder with a private key in it.
const PublicDir = "public"

// KeyFile is where service's private key lives under dir.
func KeyFile(dir, service string) string { return filepath.Join(dir, service+".key") }

// PublicKeyFile is where service's public key lives under dir.
func PublicKeyFile(dir, service string) string {
	return filepath.Join(dir, PublicDir, service+".pub")
}

const (
	pemPrivate = "PRIVATE KEY"
	pemPublic  = "PUBLIC KEY"
)

// KeysResult says what GenerateKeys did, file by file.
type KeysResult struct {
	Written, Kept []string
}

// GenerateKeys makes a key pair for each service under dir (layout above). A service whose
// .key exists keeps it unless force is set; its .pub is written from it when missing, and a
// .pub that does not match it is an error (force replaces both).
func GenerateKeys(dir string, services []string, force bool) (*KeysResult, error) {
	res := &KeysResult{}
	if err := os.MkdirAll(filepath.Join(dir, PublicDir), 0o755); err != nil {
		return res, fmt.Errorf("keys: %w", err)
	}
	for _, svc := range services {
		if !validService(svc) {
			return res, fmt.Errorf("keys: %q is not a service name (a DNS label)", svc)
		}
		keyPath, pubPath := KeyFile(dir, svc), PublicKeyFile(dir, svc)
		var key ed25519.PrivateKey
		_, statErr := os.Stat(keyPath)
		if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) && !force {
			return res, fmt.Errorf("keys: %w", statErr)
		}
		if statErr == nil && !force {
			var err error
			if key, err = LoadPrivateKey(keyPath); err != nil {
				return res, fmt.Errorf("keys: existing %w (--force replaces it)", err)
			}
			res.Kept = append(res.Kept, keyPath)
		} else {
			var err error
			if _, key, err = ed25519.GenerateKey(rand.Reader); err != nil {
				return res, fmt.Errorf("keys: generate %s: %w", svc, err)
			}
			der, err := x509.MarshalPKCS8PrivateKey(key)
			if err != nil {
				return res, fmt.Errorf("keys: encode %s: %w", svc, err)
			}
			if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: der}), 0o600); err != nil {
				return res, err
			}
			res.Written = append(res.Written, keyPath)
			// A new key makes any old .pub wrong: it is written afresh below.
			if err := os.Remove(pubPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return res, fmt.Errorf("keys: %w", err)
			}
		}
		pub := key.Public().(ed25519.PublicKey)
		if old, err := LoadPublicKey(pubPath); err == nil {
			if !old.Equal(pub) {
				return res, fmt.Errorf("keys: %s does not match %s (--force replaces both)", pubPath, keyPath)
			}
			res.Kept = append(res.Kept, pubPath)
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("keys: existing %w (--force replaces it)", err)
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return res, fmt.Errorf("keys: encode %s: %w", svc, err)
		}
		if err := writeFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: der}), 0o644); err != nil {
			return res, err
		}
		res.Written = append(res.Written, pubPath)
	}
	return res, nil
}

// writeFile writes through a temporary file and a rename, so a reader never sees half a
// key and a crash leaves the old one.
func writeFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("keys: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("keys: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	return nil
}

// LoadPrivateKey reads an Ed25519 private key (PEM "PRIVATE KEY", PKCS #8). The file must be
// private to its owner: a key that others can read is not this service's alone. Errors
// name the file.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o: a private key must not be readable or writable by group or others (chmod 600 it)", path, perm)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s is not a PEM private key (a shared hst1 key from an older version? make one key per service with `handoff keys`)", path)
	}
	if block.Type != pemPrivate {
		return nil, fmt.Errorf("%s holds a PEM %q block, want %q (PKCS #8, as `handoff keys` writes)", path, block.Type, pemPrivate)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s holds a %s key, want Ed25519", path, keyKind(k))
	}
	return key, nil
}

// LoadPublicKey reads an Ed25519 public key (PEM "PUBLIC KEY", PKIX). A missing file's error
// wraps fs.ErrNotExist.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s is not a PEM public key", path)
	}
	if block.Type != pemPublic {
		if strings.Contains(block.Type, "PRIVATE") {
			return nil, fmt.Errorf("%s holds a private key: a verifier must hold only public keys", path)
		}
		return nil, fmt.Errorf("%s holds a PEM %q block, want %q", path, block.Type, pemPublic)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s holds a %s key, want Ed25519", path, keyKind(k))
	}
	return key, nil
}

// LoadPublicKeys reads every <service>.pub in dir: the callers whose tokens a verifier
// accepts. Hidden entries (a Kubernetes volume's ..data) and other files are skipped; a
// .key file is refused, since a folder of keys a verifier holds must not be able to mint;
// a folder without any .pub is an error.
func LoadPublicKeys(dir string) (map[string]ed25519.PublicKey, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	keys := map[string]ed25519.PublicKey{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, name)
		if strings.HasSuffix(name, ".key") {
			return nil, fmt.Errorf("%s is a private key: the public-keys folder must hold only <service>.pub files (`handoff keys` writes them to %s/)", path, PublicDir)
		}
		svc, ok := strings.CutSuffix(name, ".pub")
		if !ok {
			continue
		}
		if !validService(svc) {
			return nil, fmt.Errorf("%s: %q is not a service name (a DNS label)", path, svc)
		}
		if keys[svc], err = LoadPublicKey(path); err != nil {
			return nil, err
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no <service>.pub files", dir)
	}
	return keys, nil
}

// keyKind names a parsed key's type for an error, e.g. "ecdsa.PrivateKey".
func keyKind(k any) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", k), "*")
}
