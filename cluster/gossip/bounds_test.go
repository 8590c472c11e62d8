package gossip

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
)

// The label every packet carries in clear text names no cluster, differs
// per secret and cluster, and is the same on every node.
func TestLabelHidesCluster(t *testing.T) {
	l1, err := label([]byte(testSecret), "production-cluster")
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := label([]byte(testSecret), "production-cluster")
	l3, _ := label([]byte(testSecret), "other")
	l4, _ := label([]byte(testSecret+"x"), "production-cluster")
	if strings.Contains(l1, "production") || strings.Contains(l1, "tensorferry") {
		t.Errorf("label %q reveals the cluster", l1)
	}
	if l1 != l2 || l1 == l3 || l1 == l4 {
		t.Errorf("labels %q %q %q %q: want equal for the same secret and cluster only", l1, l2, l3, l4)
	}
}

// Streams that carry the label (an onlooker saw it) and announce a huge
// encrypted message are bounded before memberlist can authenticate them:
// at most maxInboundStreams open at once, each read to maxStreamBytes at
// most.
func TestInboundStreamsBounded(t *testing.T) {
	a := start(t, "a1", 1)
	addr := a.Self().GossipAddress
	lbl, err := label([]byte(testSecret), "test")
	if err != nil {
		t.Fatal(err)
	}
	var hdr bytes.Buffer
	hdr.WriteByte(244) // memberlist's hasLabelMsg
	hdr.WriteByte(byte(len(lbl)))
	hdr.WriteString(lbl)
	hdr.WriteByte(10) // encryptMsg
	binary.Write(&hdr, binary.BigEndian, uint32(19<<20))

	// One stream sends three times what it may: it is cut.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(hdr.Bytes())
	c.Write(make([]byte, 3*maxStreamBytes)) // fails once the node cut the stream
	io.Copy(io.Discard, c)                  // until the node closes it
	if got, max := a.Stats().StreamBytesReceived, uint64(maxStreamBytes); got > max {
		t.Errorf("%d bytes read from one unauthenticated stream, want at most %d", got, max)
	}

	// Silent streams beyond maxInboundStreams are closed at once.
	const streams = maxInboundStreams + 8
	for range streams {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for a.Stats().StreamsAccepted < streams+1 {
		runtime.Gosched()
	}
	if st := a.Stats(); st.StreamsRefused == 0 {
		t.Errorf("%d streams open at once, none refused", streams)
	}
}
