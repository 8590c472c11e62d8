package wire

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

func benchMessage() *Message {
	return &Message{Target: "ps/worker-3", SenderNode: "node-1", SenderID: "trainer", Type: "example.Grad",
		Ser: SerMsgpack, Body: make([]byte, 64), Request: 12345}
}

func BenchmarkWriteMessage(b *testing.B) {
	fr := NewFramer(io.Discard, nil)
	m := benchMessage()
	b.ReportAllocs()
	for b.Loop() {
		if err := fr.WriteMessage(1, m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFrame(b *testing.B) {
	var one bytes.Buffer
	if err := NewFramer(&one, nil).WriteMessage(1, benchMessage()); err != nil {
		b.Fatal(err)
	}
	r := bytes.NewReader(nil)
	fr := NewFramer(nil, r)
	b.SetBytes(int64(one.Len()))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(one.Bytes())
		if _, err := fr.ReadFrame(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnSend measures one-way small messages through two Conns on
// loopback TCP.
func BenchmarkConnSend(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	recv := make(chan struct{}, 1)
	var count int
	target := 0
	server := NewConn(<-acc, Remote{}, ConnOptions{Handler: func(Frame) {
		count++
		if count == target {
			recv <- struct{}{}
		}
	}})
	client := NewConn(nc, Remote{}, ConnOptions{})
	server.Start()
	client.Start()
	defer server.Close(nil)
	defer client.Close(nil)
	m := benchMessage()
	ctx := context.Background()
	b.ReportAllocs()
	target = b.N
	b.ResetTimer()
	for range b.N {
		if err := client.Send(ctx, FrameMessage, 0, 0, m); err != nil {
			b.Fatal(err)
		}
	}
	<-recv
}

func loopbackPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	return nc, <-acc
}

// BenchmarkConnRoundTrip measures a 64-byte request and its response
// through two Conns on loopback TCP, with queued and direct writes; compare
// with BenchmarkRawTCPRoundTrip.
func BenchmarkConnRoundTrip(b *testing.B) {
	b.Run("queued", func(b *testing.B) { benchConnRoundTrip(b, false) })
	b.Run("direct", func(b *testing.B) { benchConnRoundTrip(b, true) })
}

func benchConnRoundTrip(b *testing.B, direct bool) {
	a, s := loopbackPair(b)
	var server *Conn
	server = NewConn(s, Remote{}, ConnOptions{DirectWrite: direct, Handler: func(f Frame) {
		m := f.(*MessageFrame).Message
		m.Target = m.SenderNode
		if err := server.Send(context.Background(), FrameMessage, 0, f.Header().Stream, &m); err != nil {
			server.Fail(err)
		}
	}})
	reply := make(chan struct{}, 1)
	client := NewConn(a, Remote{}, ConnOptions{DirectWrite: direct, Handler: func(Frame) { reply <- struct{}{} }})
	server.Start()
	client.Start()
	defer server.Close(nil)
	defer client.Close(nil)
	m := benchMessage()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Send(ctx, FrameMessage, 0, 1, m); err != nil {
			b.Fatal(err)
		}
		<-reply
	}
}

// BenchmarkRawTCPRoundTrip is the baseline: 64 bytes echoed over loopback
// TCP with plain reads and writes.
func BenchmarkRawTCPRoundTrip(b *testing.B) {
	a, s := loopbackPair(b)
	defer a.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	for b.Loop() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf); err != nil {
			b.Fatal(err)
		}
	}
	s.Close()
	<-done
}

// BenchmarkRawTCPRoundTripHop is BenchmarkRawTCPRoundTrip with the reply
// read by a separate goroutine and handed over on a channel, as a Conn's
// Handler hands replies to whoever waits for them: it separates the cost of
// that hand-off from the cost of the codec and the writer.
func BenchmarkRawTCPRoundTripHop(b *testing.B) {
	a, s := loopbackPair(b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	reply := make(chan struct{}, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(a, buf); err != nil {
				return
			}
			reply <- struct{}{}
		}
	}()
	buf := make([]byte, 64)
	for b.Loop() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
		<-reply
	}
	a.Close()
	s.Close()
	<-done
	<-readerDone
}

// BenchmarkConnSendMessage measures one-way small messages through
// Conn.SendMessage (batched while the writer is busy) on loopback TCP, with
// a receiver that only counts: the sender, the writer and their hand-offs.
// It reports the messages per FrameMessages batch. The parallel case has
// GOMAXPROCS senders on one Conn.
func BenchmarkConnSendMessage(b *testing.B) {
	b.Run("one-sender", func(b *testing.B) { benchConnSendMessage(b, false) })
	b.Run("parallel", func(b *testing.B) { benchConnSendMessage(b, true) })
}

func benchConnSendMessage(b *testing.B, parallel bool) {
	a, s := loopbackPair(b)
	var mu sync.Mutex
	var got, frames int
	target := -1
	recv := make(chan struct{})
	server := NewConn(s, Remote{}, ConnOptions{Handler: func(f Frame) {
		n := 1
		if ms, ok := f.(*MessagesFrame); ok {
			n = len(ms.Messages)
		}
		mu.Lock()
		got += n
		frames++
		if got == target {
			close(recv)
		}
		mu.Unlock()
	}})
	client := NewConn(a, Remote{}, ConnOptions{})
	server.Start()
	client.Start()
	defer server.Close(nil)
	defer client.Close(nil)
	ctx := context.Background()
	b.ReportAllocs()
	var sent atomic.Int64
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			m := benchMessage()
			for pb.Next() {
				if err := client.SendMessage(ctx, m); err != nil {
					b.Error(err)
					return
				}
				sent.Add(1)
			}
		})
	} else {
		m := benchMessage()
		for range b.N {
			if err := client.SendMessage(ctx, m); err != nil {
				b.Fatal(err)
			}
			sent.Add(1)
		}
	}
	mu.Lock()
	target = int(sent.Load())
	if got == target {
		close(recv)
	}
	mu.Unlock()
	<-recv
	b.StopTimer()
	mu.Lock()
	b.ReportMetric(float64(got)/float64(max(frames, 1)), "msgs/frame")
	mu.Unlock()
}
