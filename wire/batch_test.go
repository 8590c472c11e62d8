package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAppendMessageMatchesEncoder(t *testing.T) {
	long := strings.Repeat("x", 300)
	huge := strings.Repeat("y", 70000)
	hdr := map[string]string{}
	for i := range 20 {
		hdr[fmt.Sprintf("k%02d", i)] = fmt.Sprint(i)
	}
	for _, m := range []Message{
		{},
		{Target: "t"},
		{Target: long, SenderNode: huge[:40], SenderID: huge[:256], Type: huge, Ser: 200},
		{Body: make([]byte, 255)}, {Body: make([]byte, 256)}, {Body: make([]byte, 70000)},
		{Header: map[string]string{"b": "2", "a": "1"}},
		{Header: hdr},
		{Request: 127}, {Request: 128}, {Request: 256}, {Request: 1 << 16}, {Request: 1 << 32}, {Request: 1<<64 - 1},
		{Target: "a", SenderNode: "n", SenderID: "future$1", Type: "T", Ser: 1, Body: []byte{1}, Header: map[string]string{"k": "v"}, Request: 3},
		{Tensors: []byte{0x90}}, {Body: []byte{1}, Tensors: make([]byte, 300)},
		{Target: "a", SenderNode: "n", SenderID: "s", Type: "T", Ser: 1, Body: []byte{1}, Header: map[string]string{"k": "v"}, Request: 3, Tensors: []byte{0x91, 0x01}},
	} {
		want, err := appendMsgpack(nil, &m) // vmihailenco's reflection
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMessage([]byte{0xee}, &m); !bytes.Equal(got[1:], want) || got[0] != 0xee {
			t.Errorf("appendMessage(%.60v)\n got %.80x\nwant %.80x", m, got[1:], want)
		}
	}
}

// TestBatchIDsSameBytes: a batch that reuses the encoding of repeated
// target, sender and type fields holds exactly the bytes of the messages
// encoded one by one, whatever the sequence of fields.
func TestBatchIDsSameBytes(t *testing.T) {
	targets := []string{"", "a", "worker-1", strings.Repeat("t", 40)}
	senders := []string{"", "n1", "node-2"}
	types := []string{"", "T", "example.Grad"}
	seed := uint64(1)
	next := func(n int) int { // a fixed pseudo-random sequence (xorshift)
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	var ids batchIDs
	var got, want []byte
	for i := range 5000 {
		m := Message{Target: targets[next(len(targets))], SenderNode: senders[next(len(senders))],
			SenderID: senders[next(len(senders))], Type: types[next(len(types))], Ser: uint8(next(3)),
			Body: make([]byte, next(300)), Request: uint64(next(2) * i)}
		if next(2) == 0 && i > 0 { // a run of the same names
			m.Target, m.SenderNode, m.SenderID, m.Type = targets[1], senders[1], senders[2], types[2]
		}
		if next(50) == 0 {
			m.Header = map[string]string{"k": "v"}
		}
		if next(10) == 0 {
			ids = batchIDs{} // a new batch
			got, want = got[:0], want[:0]
		}
		got = ids.appendMessage(got, &m)
		want = appendMessage(want, &m)
		if !bytes.Equal(got, want) {
			t.Fatalf("message %d (%q %q %q %q): batch bytes differ from the message's encoding", i, m.Target, m.SenderNode, m.SenderID, m.Type)
		}
	}
}

func TestMessagesFrameBadInput(t *testing.T) {
	many := "dd00000401" + strings.Repeat("80", MaxBatchMessages+1)
	for _, tc := range []struct{ name, payload string }{
		{"too many messages", many},
		{"count beyond input", "dd00000003 80 80"},
		{"not an array", "81a174a161"},
		{"element not a map", "91 01"},
		{"bad field type", "91 81a174 01"},
		{"trailing bytes", "91 80 80"},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := unhex(t, tc.payload)
			in := append(unhex(t, hdr(uint32(len(p)), FrameMessages, 0, 0)), p...)
			_, err := NewFramer(nil, bytes.NewReader(in)).ReadFrame()
			var ce *ConnError
			if !errors.As(err, &ce) || !errors.Is(err, ErrBadBody) {
				t.Fatalf("err = %v, want a ConnError for a bad body", err)
			}
		})
	}
}

// TestStringCache: a repeated name comes back as the same string (no
// allocation), any name comes back equal, and long names are not kept.
func TestStringCache(t *testing.T) {
	var c stringCache
	for i := range 3 * stringCacheSlots {
		s := fmt.Sprint("actor-", i)
		if got := c.get([]byte(s)); got != s {
			t.Fatalf("get(%q) = %q", s, got)
		}
	}
	first := c.get([]byte("sink"))
	if n := testing.AllocsPerRun(100, func() {
		if c.get([]byte("sink")) != first {
			t.Fatal("changed")
		}
	}); n != 0 {
		t.Fatalf("%v allocations for a cached name", n)
	}
	long := strings.Repeat("z", stringCacheMaxLen+1)
	if c.get([]byte(long)) != long {
		t.Fatal("long name changed")
	}
	for _, s := range c.slots {
		if len(s) > stringCacheMaxLen {
			t.Fatal("a long name was cached")
		}
	}
}

// TestStringCacheFields: each field's string comes back equal whatever the
// other fields hold, a field that repeats its previous string allocates
// nothing, and a long string is not remembered.
func TestStringCacheFields(t *testing.T) {
	var c stringCache
	for i := range 2 * stringCacheSlots {
		for f, s := range []string{fmt.Sprint("t", i), fmt.Sprint("node-", i%3), "bench.Msg"} {
			if got := c.field(f, []byte(s)); got != s {
				t.Fatalf("field(%d, %q) = %q", f, s, got)
			}
		}
	}
	target := []byte("sink")
	c.field(fieldTarget, target)
	c.slots = [stringCacheSlots]string{} // only last can answer now
	if n := testing.AllocsPerRun(100, func() {
		if c.field(fieldTarget, target) != "sink" {
			t.Fatal("changed")
		}
	}); n != 0 {
		t.Fatalf("%v allocations for a repeated target", n)
	}
	long := strings.Repeat("z", stringCacheMaxLen+1)
	if c.field(fieldType, []byte(long)) != long || c.last[fieldType] == long {
		t.Fatal("a long type name was remembered or changed")
	}
}

// batchReceiver collects the messages of MessageFrame and MessagesFrame
// frames and the order of System frames among them.
type batchReceiver struct {
	mu      sync.Mutex
	msgs    []Message
	batches int
	events  []string // "m<request>" or "s<target>"
	want    int
	all     chan struct{}
}

func (r *batchReceiver) handle(f Frame) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add := func(m Message) {
		m.Body = bytes.Clone(m.Body)
		r.msgs = append(r.msgs, m)
		r.events = append(r.events, fmt.Sprint("m", m.Request))
	}
	switch f := f.(type) {
	case *MessageFrame:
		add(f.Message)
	case *MessagesFrame:
		r.batches++
		for _, m := range f.Messages {
			add(m)
		}
	case *SystemFrame:
		r.events = append(r.events, "s"+f.System.Target)
	}
	if len(r.events) == r.want {
		close(r.all)
	}
}

func TestConnSendMessageBatchesInOrder(t *testing.T) {
	forBothWriteModes(t, testConnSendMessageBatches)
}

func testConnSendMessageBatches(t *testing.T, direct bool) {
	a, b := tcpPair(t)
	const n, every = 20000, 997
	r := &batchReceiver{want: n + n/every, all: make(chan struct{})}
	cb := NewConn(b, Remote{Node: "a"}, ConnOptions{Handler: r.handle})
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{DirectWrite: direct})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)
	ctx := context.Background()
	body := []byte("0123456789abcdef")
	var want []string
	for i := range n {
		body[0] = byte(i)
		if err := ca.SendMessage(ctx, &Message{Target: "sink", Type: "T", Ser: 1, Body: body, Request: uint64(i)}); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprint("m", i))
		if i%every == every-1 {
			// A system frame never overtakes the messages before it, nor
			// is overtaken by the ones after it.
			if err := ca.Send(ctx, FrameSystem, 0, 0, &System{Kind: SystemStop, Target: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
			want = append(want, fmt.Sprint("s", i))
		}
	}
	select {
	case <-r.all:
	case <-time.After(20 * time.Second):
		t.Fatalf("received %d of %d frames", len(r.events), r.want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if e != want[i] {
			t.Fatalf("event %d is %s, want %s", i, e, want[i])
		}
	}
	for i, m := range r.msgs {
		if m.Target != "sink" || m.Type != "T" || m.Ser != 1 || len(m.Body) != len(body) || m.Body[0] != byte(i) {
			t.Fatalf("message %d arrived as %+v", i, m)
		}
	}
	t.Logf("%d messages in %d batches", n, r.batches)
	if r.batches == 0 {
		t.Fatal("no batch: a burst of messages must share frames")
	}
}

func TestConnSendMessageConcurrentSenders(t *testing.T) {
	a, b := tcpPair(t)
	const senders, each = 4, 5000
	r := &batchReceiver{want: senders * each, all: make(chan struct{})}
	cb := NewConn(b, Remote{}, ConnOptions{Handler: r.handle})
	ca := NewConn(a, Remote{}, ConnOptions{SendQueue: 4, DirectWrite: true})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := ca.SendMessage(context.Background(), &Message{Target: fmt.Sprint(s), Request: uint64(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-r.all:
	case <-time.After(20 * time.Second):
		t.Fatal("not all messages arrived")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	next := map[string]uint64{}
	for _, m := range r.msgs {
		if m.Request != next[m.Target] {
			t.Fatalf("sender %s: got %d, want %d", m.Target, m.Request, next[m.Target])
		}
		next[m.Target]++
	}
}

// TestConnSendMessageBackpressure: a stalled peer bounds what SendMessage
// accepts (queue slots times batch size), and Close releases a blocked
// sender.
// TestConnSendMessageMixedSizes: senders whose messages range from empty
// to larger than a batch, mixed with frames that close the open batch,
// while the writer seals batches as they fill: every message arrives once,
// intact, in its sender's order.
func TestConnSendMessageMixedSizes(t *testing.T) {
	a, b := tcpPair(t)
	const senders, each = 3, 3000
	r := &batchReceiver{want: senders*each + senders*each/100, all: make(chan struct{})}
	cb := NewConn(b, Remote{}, ConnOptions{Handler: r.handle})
	ca := NewConn(a, Remote{}, ConnOptions{SendQueue: 16, DirectWrite: true})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)
	size := func(s, i int) int {
		switch (s*each + i) % 97 {
		case 0:
			return maxBatchBytes + 1000 // travels alone
		case 1, 2:
			return 9000 // a few fill a batch
		default:
			return (s*7 + i*13) % 300
		}
	}
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				body := bytes.Repeat([]byte{byte(s*31 + i)}, size(s, i))
				m := &Message{Target: fmt.Sprint(s), Type: "T", SenderNode: "n", Request: uint64(i), Body: body}
				if i%5 == 0 {
					m.SenderID = fmt.Sprint("id", i%3) // names that change within a batch
				}
				if err := ca.SendMessage(context.Background(), m); err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					if err := ca.Send(context.Background(), FrameSystem, 0, 0, &System{Target: "x"}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-r.all:
	case <-time.After(30 * time.Second):
		t.Fatal("not all messages arrived")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	next := map[string]int{}
	for _, m := range r.msgs {
		var s int
		fmt.Sscan(m.Target, &s)
		i := next[m.Target]
		if m.Request != uint64(i) {
			t.Fatalf("sender %s: got message %d, want %d", m.Target, m.Request, i)
		}
		if want := bytes.Repeat([]byte{byte(s*31 + i)}, size(s, i)); !bytes.Equal(m.Body, want) || m.Type != "T" || m.SenderNode != "n" {
			t.Fatalf("sender %s message %d: %d bytes, type %q, node %q", m.Target, i, len(m.Body), m.Type, m.SenderNode)
		}
		wantID := ""
		if i%5 == 0 {
			wantID = fmt.Sprint("id", i%3)
		}
		if m.SenderID != wantID {
			t.Fatalf("sender %s message %d: sender id %q, want %q", m.Target, i, m.SenderID, wantID)
		}
		next[m.Target]++
	}
	if r.batches == 0 {
		t.Fatal("no message was batched")
	}
}

func TestConnSendMessageBackpressure(t *testing.T) {
	a, b := net.Pipe() // nobody reads b
	defer b.Close()
	const queue = 4
	c := NewConn(a, Remote{Node: "slow"}, ConnOptions{SendQueue: queue})
	c.Start()
	m := &Message{Target: "t", Body: make([]byte, 1000)}
	accepted := 0
	var err error
	for range 100000 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err = c.SendMessage(ctx, m)
		cancel()
		if err != nil {
			break
		}
		accepted++
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %d sends: %v, want context.DeadlineExceeded", accepted, err)
	}
	// Queued batches plus the one the blocked writer holds and its buffer.
	if limit := (queue+2)*(maxBatchBytes/1000+1) + connBufferSize/1000; accepted > limit {
		t.Fatalf("%d messages accepted by a stalled connection, want at most %d", accepted, limit)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- c.SendMessage(context.Background(), m) }()
	waitBlocked(t, "wire.(*Conn).SendMessage(")
	c.Close(nil)
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked SendMessage after Close: %v", err)
	}
}

func TestConnSendMessageTooLarge(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := NewConn(a, Remote{}, ConnOptions{MaxFrameSize: 1024, DirectWrite: true})
	defer c.Close(nil)
	err := c.SendMessage(context.Background(), &Message{Body: make([]byte, 2000)})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
}

// TestConnMixedFramesKeepOrder: batched messages and single frames sent
// interleaved arrive, every one, in the order they were sent.
func TestConnMixedFramesKeepOrder(t *testing.T) {
	a, b := tcpPair(t)
	const n = 3000
	r := &batchReceiver{want: n + n/10, all: make(chan struct{})}
	cb := NewConn(b, Remote{}, ConnOptions{Handler: r.handle})
	ca := NewConn(a, Remote{}, ConnOptions{DirectWrite: true})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)
	ctx := context.Background()
	var want []string
	for i := range n {
		if err := ca.SendMessage(ctx, &Message{Target: "x", Request: uint64(i)}); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprint("m", i))
		if i%10 == 0 {
			if err := ca.Send(ctx, FrameSystem, 0, 0, &System{Kind: SystemWatch, Target: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
			want = append(want, fmt.Sprint("s", i))
		}
	}
	select {
	case <-r.all:
	case <-time.After(20 * time.Second):
		t.Fatalf("received %d of %d frames", len(r.events), r.want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if e != want[i] {
			t.Fatalf("event %d is %s, want %s", i, e, want[i])
		}
	}
}

// TestSendMessageBoundedInBytes: against a peer that reads nothing,
// SendMessage accepts at most maxQueuedBatches batches (plus what the
// blocked writer holds) and then waits, whatever the frame queue's length.
func TestSendMessageBoundedInBytes(t *testing.T) {
	a, b := net.Pipe() // nobody reads b: the writer blocks
	defer b.Close()
	c := NewConn(a, Remote{Node: "slow"}, ConnOptions{})
	c.Start()
	m := &Message{Target: "x", Body: make([]byte, 200)}
	accepted := 0
	var err error
	for range 100000 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err = c.SendMessage(ctx, m)
		cancel()
		if err != nil {
			break
		}
		accepted++
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %d messages: %v, want context.DeadlineExceeded", accepted, err)
	}
	perBatch := maxBatchBytes/len(appendMessage(nil, m)) + 1
	// The queued batches, the one being written and those the blocked
	// writer copied into its 64 KiB buffer.
	if limit := (maxQueuedBatches + 1 + connBufferSize/maxBatchBytes) * perBatch; accepted > limit {
		t.Fatalf("%d messages (%d KiB) accepted by a stalled connection, want at most %d", accepted, accepted*200>>10, limit)
	}
	if accepted < maxQueuedBatches*perBatch/2 {
		t.Fatalf("only %d messages accepted before backpressure", accepted)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- c.SendMessage(context.Background(), m) }()
	waitBlocked(t, "wire.(*Conn).SendMessage(")
	c.Close(nil)
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked SendMessage after Close: %v", err)
	}
}

// TestMessageHeaderCountDoesNotSizeAllocation: a header map's declared
// entry count is not bytes that are there; one that declares half a
// million (duplicate, empty) entries is refused (MaxHeaderEntries) without
// allocating for them.
func TestMessageHeaderCountDoesNotSizeAllocation(t *testing.T) {
	var entries uint32 = 1 << 19
	body := []byte{0x81, 0xa1, 'h', 0xdf, byte(entries >> 24), byte(entries >> 16), byte(entries >> 8), byte(entries)}
	body = append(body, bytes.Repeat([]byte{0xa0, 0xa0}, int(entries))...)
	if err := checkMsgpack(body, MaxMsgpackDepth); err != nil {
		t.Fatal(err)
	}
	var m Message
	var err error
	if n := allocatedBytes(func() { err = decodeMessage(body, &m) }); n > 64<<10 {
		t.Fatalf("%d bytes allocated decoding a header of %d declared entries (%d bytes of input)", n, entries, len(body))
	}
	if !errors.Is(err, errHeaderTooLarge) {
		t.Fatalf("header %v, err %v; want it refused", m.Header, err)
	}
}
