// Package ibverbs gives Go access to RDMA verbs (rdma-core's libibverbs)
// without linking against it: libibverbs.so.1 is opened with dlopen at run
// time, so a binary built with this package starts on machines without
// rdma-core. There every call fails with an error wrapping ErrNoRDMA that
// says why, and Devices returns an empty list.
//
// It covers what a one-sided RDMA data channel needs: device and port
// discovery (GUID, state, link layer, MTU, LID, GID table with the RoCE v2
// IPv4-mapped entry), contexts, protection domains, completion queues,
// reliable-connected queue pairs and their RESET→INIT→RTR→RTS state machine,
// memory regions on host memory, on GPU memory through a dmabuf file
// descriptor (RegDmabufMR) or through peer memory (RegMR on a device
// pointer), RDMA READ work requests and completion polling (CQ.Poll, and
// CQ.Await for one work request), and type-2 memory windows (window.go):
// AllocMW, QP.BindMW (IBV_WR_BIND_MW over a region registered with
// AccessMWBind), QP.LocalInvalidate (IBV_WR_LOCAL_INV), the device's
// DeviceCap flags, and ProbeWindows, which checks over loopback that a
// device confines remote reads to a bound window (soft-RoCE up to Linux
// 6.12 at least does not: a read past a window's end succeeds).
//
// Every error names the verbs call and the errno; a failed work completion
// becomes a *WCError carrying ibv_wc_status_str.
//
// The struct layouts come from rdma-core's headers (Debian:
// libibverbs-dev) at build time. Built without them (or with the tag
// noibverbs, without cgo, or off Linux) the package still compiles and
// every call fails with ErrNoRDMA saying so.
//
// Example: read 4 KiB from a remote region into a local one.
//
//	devs, err := ibverbs.Devices()
//	if err != nil || len(devs) == 0 {
//		return err // wraps ErrNoRDMA where rdma-core or a device is missing
//	}
//	ctx, err := ibverbs.Open(devs[0].Name)
//	...
//	defer ctx.Close()
//	port := devs[0].Ports[0] // check port.Usable()
//	pd, _ := ctx.AllocPD()
//	cq, _ := ctx.CreateCQ(64)
//	qp, _ := pd.CreateRCQP(cq, ibverbs.QPCaps{MaxSendWR: 64})
//	local := qp.LocalEndpoint(port, psn) // send to the peer, receive remote
//	err = qp.Connect(port, 0, remote, psn, ibverbs.ConnectOptions{})
//	mr, _ := pd.RegMR(buf.Ptr(), buf.Len(), ibverbs.AccessLocalWrite)
//	err = qp.PostReads([]ibverbs.ReadRequest{{WRID: 1, LocalAddr: uintptr(mr.Addr()),
//		LKey: mr.LKey(), Length: 4096, RemoteAddr: raddr, RKey: rkey, Signaled: true}})
//	wcs := make([]ibverbs.WorkCompletion, 8)
//	n, err := cq.Poll(wcs) // then wcs[i].Err()
package ibverbs
