// Package builtin registers tensorferry's own data channels: importing it
// for its side effect registers the backends of local, ipc, verbs and
// staging with the rdma registry. It has no other content.
//
//	import _ "github.com/tensorferry/tensorferry/rdma/builtin"
//
// A program that wants only some of them imports those channel packages
// instead; one with a channel of its own imports that channel's package
// too (see package rdma).
package builtin
