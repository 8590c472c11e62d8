package ps

import (
	"reflect"
	"testing"

	"github.com/tensorferry/tensorferry/wire"
	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// TestMessagesCodecsInterchange: the generated codecs of the messages
// without tensors read what vmihailenco's reflection writes and the other
// way round, nil slices and maps included.
func TestMessagesCodecsInterchange(t *testing.T) {
	cfg := DefaultConfig()
	for _, m := range []interface {
		msgp.Marshaler
		msgp.Unmarshaler
	}{
		&Setup{Config: cfg, Layout: Layout{ShardNodes: []string{"a"}, WorkerNodes: []string{"b", "c"}}, DriverNode: "b"},
		&Setup{},
		&Ready{Shards: []ShardPlace{{Shard: 1, Node: "a", Device: "cuda:0"}}, Err: "e"},
		&Ready{Shards: []ShardPlace{}},
		&Pull{Step: -1}, &Train{}, &Finish{},
		&Ack{Shard: 1, Step: 1 << 40, Err: "x"},
		&Progress{Worker: 3, Step: 4, Loss: 0.25, Samples: 1000},
		&Done{Worker: 1},
		&Finished{Node: "n", MessagesSent: 7, Channels: map[string]ChannelBytes{"ipc": {Transfers: 2, Bytes: 1 << 33}}},
		&Finished{Channels: map[string]ChannelBytes{}},
	} {
		typ := reflect.TypeOf(m).Elem()
		gen, err := m.MarshalMsg(nil)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		viaRef := reflect.New(typ)
		if err := msgpack.Unmarshal(gen, viaRef.Interface()); err != nil {
			t.Fatalf("%v: vmihailenco cannot read the generated encoding: %v", typ, err)
		}
		viaGen := reflect.New(typ)
		if rest, err := viaGen.Interface().(msgp.Unmarshaler).UnmarshalMsg(ref); err != nil || len(rest) != 0 {
			t.Fatalf("%v: the generated decoder cannot read vmihailenco's encoding: %v", typ, err)
		}
		if !reflect.DeepEqual(viaRef.Interface(), m) || !reflect.DeepEqual(viaGen.Interface(), m) {
			t.Fatalf("%v:\n sent %+v\nreflective %+v\ngenerated  %+v", typ, m, viaRef.Interface(), viaGen.Interface())
		}
	}
}

// FuzzMessagesDecode: the generated decoders, behind the validation the
// registry applies first (wire.CheckMsgpack), never panic on any input.
func FuzzMessagesDecode(f *testing.F) {
	b, _ := (&Setup{Config: DefaultConfig(), Layout: Layout{ShardNodes: []string{"a"}}}).MarshalMsg(nil)
	f.Add(b)
	b, _ = (&Finished{Channels: map[string]ChannelBytes{"ipc": {Bytes: 1}}}).MarshalMsg(nil)
	f.Add(b)
	b, _ = (&Ready{Shards: []ShardPlace{{Node: "n"}}}).MarshalMsg(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		if wire.CheckMsgpack(in) != nil {
			return
		}
		for _, m := range []msgp.Unmarshaler{&Setup{}, &Ready{}, &Pull{}, &Weights{}, &Push{}, &Ack{}, &Progress{}, &Done{}, &Finished{}, &Train{}, &Finish{}} {
			_, _ = m.UnmarshalMsg(in)
		}
	})
}
