package main

//go:generate msgp -file messages.go -o messages_gen.go -io=false -tests=false -unexported

// tfMsg is the 64-byte message of the tensorferry path, a plain Go struct
// encoded with msgpack by the methods msgp's generator wrote
// (messages_gen.go), which tensorferry's registry prefers to reflection.
type tfMsg struct {
	Payload []byte `msgpack:",allownil"`
}
