package builtin

import (
	_ "github.com/tensorferry/tensorferry/rdma/ipc"     // registers rdma.IPC
	_ "github.com/tensorferry/tensorferry/rdma/local"   // registers rdma.Local
	_ "github.com/tensorferry/tensorferry/rdma/staging" // registers rdma.Staging
	_ "github.com/tensorferry/tensorferry/rdma/verbs"   // registers rdma.Verbs
)
