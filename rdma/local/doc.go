// Package local is the data channel for transfers within one process: the
// fetcher and the owner are the same node, so Fetch acquires the export from
// the node's own Store and copies it into the destination (a memmove for
// host memory, one device copy through memory.Copy otherwise). No bytes
// touch a socket.
//
//	ch, _ := local.New(env)            // env.Store is the node's Store
//	err := ch.Fetch(ctx, d, dst)        // d.Owner == env.Node
//	_ = env.Store.Release(d.ExportID, d.Lease)
package local
