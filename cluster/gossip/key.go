package gossip

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
)

// keySalt is the HKDF salt of the gossip key: the protocol and its version,
// so that no other use of the cluster secret derives the same key.
const keySalt = "tensorferry gossip v1"

// keySize is the gossip key's size in bytes: AES-256-GCM in memberlist.
const keySize = 32

// deriveKey derives the gossip key of cluster from the cluster secret with
// HKDF-SHA256: salt "tensorferry gossip v1", info "cluster " + the name.
// Clusters sharing a secret still get different keys.
func deriveKey(secret []byte, cluster string) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, []byte(keySalt), "cluster "+cluster, keySize)
}

// labelSalt is the HKDF salt of the label, apart from the key's.
const labelSalt = "tensorferry gossip label v1"

// label is the memberlist label of cluster's traffic: packets and streams
// of another label are refused before they are decrypted. Every packet
// carries it in clear text, so it is derived from the secret (HKDF-SHA256,
// 16 bytes, hex) instead of naming the cluster: it tells an onlooker
// nothing, and only a holder of the secret can make it.
func label(secret []byte, cluster string) (string, error) {
	b, err := hkdf.Key(sha256.New, secret, []byte(labelSalt), "cluster "+cluster, 16)
	if err != nil {
		return "", err
	}
	return "tf" + hex.EncodeToString(b), nil
}
