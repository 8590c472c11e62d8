package main

// The message types' codecs are written by msgp's generator
// (messages_gen.go), as a user's would be: the registry uses them instead
// of reflection.

//go:generate msgp -file messages.go -o messages_gen.go -io=false -tests=false -unexported

import (
	"time"

	"github.com/tensorferry/tensorferry/tensor"
)

// Msg carries one tensor, fetched by the receiving node before delivery.
type Msg struct {
	T *tensor.Tensor
	// Check asks the receiver for the CRC-32 of the bytes it got.
	Check bool
}

// Ack answers a Msg once it was delivered.
type Ack struct {
	Bytes int64
	CRC   uint32
	// Channel carried the tensor ("inline" when it came in the frame).
	Channel string
	// Fetch is the time the receiving node spent in the channel's Fetch
	// (the average, when several fetches ended since the previous Msg).
	Fetch time.Duration
	// Device is where the receiver got the tensor.
	Device string
	Err    string
}
