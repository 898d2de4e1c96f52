// Package certs makes a development certificate authority and one certificate per service,
// and loads them into tls.Configs for mutual TLS between the services.
//
// Every service certificate names its service twice: as the URI SAN
// spiffe://handoff.local/<svc> (what the identity interceptor reads) and as the subject
// CN. It also carries the DNS SANs localhost and <svc> and the IP SANs 127.0.0.1 and ::1,
// so it verifies on one laptop and under a Kubernetes Service named after the service, and
// both the ServerAuth and ClientAuth extended key usages, so one certificate serves a
// service as a server and as a client.
//
// The layout of a directory, as Generate writes it:
//
//	ca.pem, ca-key.pem          the CA (the key signs new service certificates)
//	<svc>.pem, <svc>-key.pem    one pair per service
//
// Keys are ECDSA P-256 in PKCS #8 PEM, written 0600. This is a development CA: keep
// ca-key.pem off shared disks and out of version control, and use a real PKI (cert-manager,
// SPIRE) in production; the files are compatible with both, since only the CA changes.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// TrustDomain is the SPIFFE trust domain of the service identities.
const TrustDomain = "handoff.local"

// File names of the CA in a certificate directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// DefaultServices are the identities `handoff certs` makes by default: the three services
// and "operator", for a person calling services by hand (grpcurl).
var DefaultServices = []string{"coordinator", "agentrunner", "writeback", "operator"}

// clockSkew backdates NotBefore so a certificate is valid at once on a host whose clock is
// a little behind.
const clockSkew = 5 * time.Minute

// SPIFFEID returns the identity URI of a service: spiffe://handoff.local/<svc>.
func SPIFFEID(svc string) string { return "spiffe://" + TrustDomain + "/" + svc }

// CertFile returns the path of a service's certificate in dir.
func CertFile(dir, svc string) string { return filepath.Join(dir, svc+".pem") }

// KeyFile returns the path of a service's private key in dir.
func KeyFile(dir, svc string) string { return filepath.Join(dir, svc+"-key.pem") }

var serviceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckServiceName reports whether svc can name a service: a DNS label (lower-case
// letters, digits and inner hyphens, at most 63 characters), so it is at once a DNS SAN,
// a SPIFFE path segment and a file name. "ca" is taken by the CA's files.
func CheckServiceName(svc string) error {
	if !serviceName.MatchString(svc) {
		return fmt.Errorf("certs: service name %q: want a DNS label (a-z, 0-9 and inner '-', 1 to 63 characters)", svc)
	}
	if svc == "ca" {
		return errors.New(`certs: service name "ca" is taken by the CA's files (ca.pem, ca-key.pem)`)
	}
	return nil
}

// Options says what GenerateWith makes.
type Options struct {
	// Dir is created (0700) when missing.
	Dir      string
	Services []string
	// Validity of the CA and of each new service certificate, from now. A service
	// certificate signed by an existing CA ends no later than the CA.
	Validity time.Duration
	// Force replaces every file: a new CA and new certificates for Services. Without it,
	// existing files are kept: an existing CA signs the services that have no certificate
	// yet, and an existing service certificate is checked against the CA and kept.
	Force bool
}

// Result lists the files GenerateWith wrote and the ones it found and kept, in order.
type Result struct {
	Written []string
	Kept    []string
	// Stale lists other service certificates in Dir (not in Options.Services) that the
	// CA a forced run replaced had signed: they no longer verify.
	Stale []string
}

// Generate writes a CA and a certificate for each service into dir, keeping the files
// that exist (see Options.Force).
func Generate(dir string, services []string, validity time.Duration) error {
	_, err := GenerateWith(Options{Dir: dir, Services: services, Validity: validity})
	return err
}

// GenerateWith writes a CA and a certificate for each of o.Services into o.Dir. It checks
// everything before it writes anything, so an error leaves the directory as it was.
func GenerateWith(o Options) (*Result, error) {
	if o.Dir == "" {
		return nil, errors.New("certs: no directory given")
	}
	if o.Validity <= 0 {
		return nil, fmt.Errorf("certs: validity must be positive, got %s", o.Validity)
	}
	if len(o.Services) == 0 {
		return nil, errors.New("certs: no service given")
	}
	seen := map[string]bool{}
	var services []string
	for _, svc := range o.Services {
		if err := CheckServiceName(svc); err != nil {
			return nil, err
		}
		if !seen[svc] {
			seen[svc] = true
			services = append(services, svc)
		}
	}
	now := time.Now()
	res := &Result{}

	// Plan: decide file by file what to keep and what to make.
	caCertPath, caKeyPath := filepath.Join(o.Dir, CAFile), filepath.Join(o.Dir, CAKeyFile)
	var (
		ca       *x509.Certificate
		caKey    crypto.Signer
		newCA    bool
		toSign   []string
		writes   []pendingFile
		keptCert = map[string]bool{}
	)
	if !o.Force {
		for _, svc := range services {
			certOK, keyOK := exists(CertFile(o.Dir, svc)), exists(KeyFile(o.Dir, svc))
			switch {
			case certOK && keyOK:
				keptCert[svc] = true
			case certOK != keyOK:
				have, miss := CertFile(o.Dir, svc), KeyFile(o.Dir, svc)
				if keyOK {
					have, miss = miss, have
				}
				return nil, fmt.Errorf("certs: %s exists but %s does not; remove it or use force to replace both", have, miss)
			}
		}
	}
	for _, svc := range services {
		if !keptCert[svc] {
			toSign = append(toSign, svc)
		}
	}
	caCertOK, caKeyOK := exists(caCertPath), exists(caKeyPath)
	switch {
	case o.Force || (!caCertOK && !caKeyOK):
		if !o.Force && len(keptCert) > 0 {
			return nil, fmt.Errorf("certs: %s and %s are missing but service certificates exist (signed by a CA that is gone); use force to start over", caCertPath, caKeyPath)
		}
		newCA = true
	case !caCertOK:
		return nil, fmt.Errorf("certs: %s exists but %s does not; use force to make a new CA", caKeyPath, caCertPath)
	default:
		var err error
		if ca, err = loadCert(caCertPath); err != nil {
			return nil, err
		}
		if !ca.IsCA {
			return nil, fmt.Errorf("certs: %s is not a CA certificate", caCertPath)
		}
		if now.After(ca.NotAfter) {
			return nil, fmt.Errorf("certs: %s expired at %s; use force to make a new CA", caCertPath, ca.NotAfter.Format(time.RFC3339))
		}
		if len(toSign) > 0 {
			if !caKeyOK {
				return nil, fmt.Errorf("certs: %s is missing: cannot sign certificates for %v without it; use force to make a new CA", caKeyPath, toSign)
			}
			if caKey, err = loadKey(caKeyPath); err != nil {
				return nil, err
			}
			if !publicKeysEqual(caKey.Public(), ca.PublicKey) {
				return nil, fmt.Errorf("certs: %s does not belong to %s", caKeyPath, caCertPath)
			}
		}
	}
	if !newCA {
		// A kept certificate must still chain to the CA, or mTLS would fail later and far
		// from the cause.
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		for _, svc := range services {
			if !keptCert[svc] {
				continue
			}
			if _, err := loadPair(o.Dir, svc, pool, now); err != nil {
				return nil, fmt.Errorf("%w; use force to replace it", err)
			}
		}
	}

	// Make.
	if newCA {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("certs: CA key: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          mustSerial(),
			Subject:               pkix.Name{CommonName: "handoff development CA", Organization: []string{"handoff (development)"}},
			NotBefore:             now.Add(-clockSkew),
			NotAfter:              now.Add(o.Validity),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return nil, fmt.Errorf("certs: sign CA: %w", err)
		}
		if ca, err = x509.ParseCertificate(der); err != nil {
			return nil, fmt.Errorf("certs: parse CA: %w", err)
		}
		caKey = key
		keyPEM, err := encodeKey(key)
		if err != nil {
			return nil, err
		}
		writes = append(writes, pendingFile{caCertPath, encodeCert(der), 0o644}, pendingFile{caKeyPath, keyPEM, 0o600})
	} else {
		res.Kept = append(res.Kept, caCertPath)
		if caKeyOK {
			res.Kept = append(res.Kept, caKeyPath)
		}
	}
	for _, svc := range services {
		if keptCert[svc] {
			res.Kept = append(res.Kept, CertFile(o.Dir, svc), KeyFile(o.Dir, svc))
			continue
		}
		certPEM, keyPEM, err := issue(ca, caKey, svc, now, o.Validity)
		if err != nil {
			return nil, err
		}
		writes = append(writes, pendingFile{CertFile(o.Dir, svc), certPEM, 0o644}, pendingFile{KeyFile(o.Dir, svc), keyPEM, 0o600})
	}

	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	if o.Force && caCertOK {
		res.Stale = staleCerts(o.Dir, seen)
	}
	for _, f := range writes {
		if err := writeFile(f); err != nil {
			return res, err
		}
		res.Written = append(res.Written, f.path)
	}
	return res, nil
}

// issue makes a service certificate signed by the CA.
func issue(ca *x509.Certificate, caKey crypto.Signer, svc string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s key: %w", svc, err)
	}
	id, err := url.Parse(SPIFFEID(svc))
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s identity: %w", svc, err)
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: mustSerial(),
		Subject:      pkix.Name{CommonName: svc, Organization: []string{"handoff (development)"}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id},
		DNSNames:     []string{"localhost", svc},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: sign %s: %w", svc, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return encodeCert(der), keyPEM, nil
}

// ServerTLS returns the TLS configuration of service svc as a server: it presents svc's
// certificate and requires every client to present one that chains to ca.pem (TLS 1.3).
func ServerTLS(dir, svc string) (*tls.Config, error) {
	pair, pool, err := load(dir, svc)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, nil
}

// ClientTLS returns the TLS configuration of service svc as a client: it presents svc's
// certificate and verifies the server's against ca.pem (TLS 1.3). The server name checked
// is the host of the dial target (gRPC fills it in), which the service certificates cover
// for localhost, 127.0.0.1, ::1 and the service's own name.
func ClientTLS(dir, svc string) (*tls.Config, error) {
	pair, pool, err := load(dir, svc)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
	}, nil
}

// load reads the CA pool and svc's key pair, and checks the pair against the CA now, so a
// wrong or expired file fails at start rather than at the first handshake.
func load(dir, svc string) (tls.Certificate, *x509.CertPool, error) {
	if err := CheckServiceName(svc); err != nil {
		return tls.Certificate{}, nil, err
	}
	caPath := filepath.Join(dir, CAFile)
	ca, err := loadCert(caPath)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	if !ca.IsCA {
		return tls.Certificate{}, nil, fmt.Errorf("certs: %s is not a CA certificate", caPath)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	pair, err := loadPair(dir, svc, pool, time.Now())
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return pair, pool, nil
}

func loadPair(dir, svc string, pool *x509.CertPool, now time.Time) (tls.Certificate, error) {
	certPath, keyPath := CertFile(dir, svc), KeyFile(dir, svc)
	certPEM, err := readFile(certPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := readFile(keyPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: %s with %s: %w", certPath, keyPath, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("certs: %s: %w", certPath, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: %s does not verify against %s: %w", certPath, filepath.Join(dir, CAFile), err)
	}
	return pair, nil
}

func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("certs: %s is missing (make it with `handoff certs --dir %s`)", path, filepath.Dir(path))
	}
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	return b, nil
}

func loadCert(path string) (*x509.Certificate, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("certs: %s holds no PEM CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", path, err)
	}
	return c, nil
}

func loadKey(path string) (crypto.Signer, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("certs: %s holds no PEM block", path)
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("certs: %s holds a %q block, want PRIVATE KEY", path, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", path, err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("certs: %s: key of type %T cannot sign", path, key)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func mustSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("certs: random serial: " + err.Error()) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

// staleCerts lists the service certificates in dir other than those of services.
func staleCerts(dir string, services map[string]bool) []string {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.pem"))
	var stale []string
	for _, p := range paths {
		base := filepath.Base(p)
		svc := strings.TrimSuffix(base, ".pem")
		if base == CAFile || base == CAKeyFile || services[svc] || strings.HasSuffix(svc, "-key") {
			continue
		}
		stale = append(stale, p)
	}
	return stale
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

type pendingFile struct {
	path string
	data []byte
	mode os.FileMode
}

// writeFile writes through a temporary file in the same directory and renames it into
// place, so a reader never sees half a file and a key is never readable by others, even
// for a moment.
func writeFile(f pendingFile) error {
	tmp, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	name := tmp.Name()
	defer os.Remove(name) // a no-op after the rename
	if err := tmp.Chmod(f.mode); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := tmp.Write(f.data); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: write %s: %w", f.path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("certs: write %s: %w", f.path, err)
	}
	if err := os.Rename(name, f.path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
