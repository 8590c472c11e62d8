package gossip

import (
	"crypto/hkdf"
	"crypto/sha256"
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

// label is the memberlist label of cluster's traffic: packets and streams
// of another label are refused before they are decrypted.
func label(cluster string) string { return "tensorferry/" + cluster }
