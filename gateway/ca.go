package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"sync"
	"time"

	"tine/internal/atomicfile"
)

// CA is a sandbox's own certificate authority: the gateway terminates the
// sandbox's TLS with leaf certificates it signs, and only that sandbox's
// trust store holds its certificate. Its key stays on the host.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// maxLeaves bounds the cache of leaf certificates.
const maxLeaves = 1024

// NewCA makes a CA named after the sandbox, valid for ten years.
func NewCA(sandbox string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "tine sandbox " + sandbox + " gateway CA", Organization: []string{"tine"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	return newCA(der, key)
}

func newCA(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	return &CA{cert: cert, key: key, der: der, leaves: map[string]*tls.Certificate{}}, nil
}

// LoadOrNewCA reads the CA kept at path (certificate and key, PEM), or
// makes one and writes it there (mode 0600, atomically and durably: the
// sandbox's OS layer comes to trust it) when there is none.
func LoadOrNewCA(path, sandbox string) (*CA, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		ca, err := NewCA(sandbox)
		if err != nil {
			return nil, err
		}
		kb, err := x509.MarshalECPrivateKey(ca.key)
		if err != nil {
			return nil, err
		}
		out := append(ca.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})...)
		if err := atomicfile.WriteFile(path, out, 0o600); err != nil {
			return nil, fmt.Errorf("sandbox CA: write %s: %w", path, err)
		}
		return ca, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	var der []byte
	var key *ecdsa.PrivateKey
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			der = blk.Bytes
		case "EC PRIVATE KEY":
			if key, err = x509.ParseECPrivateKey(blk.Bytes); err != nil {
				return nil, fmt.Errorf("sandbox CA %s: %w", path, err)
			}
		}
	}
	if der == nil || key == nil {
		return nil, fmt.Errorf("sandbox CA %s: want a certificate and an EC key (remove the file to make a new CA)", path)
	}
	return newCA(der, key)
}

// CertPEM returns the CA's certificate, PEM-encoded: what goes into the
// sandbox's trust store.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Pool returns a pool holding only the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Leaf returns a certificate for name signed by the CA (cached).
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(0, 0, 30),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: key}
	ca.leaves[name] = c
	return c, nil
}
