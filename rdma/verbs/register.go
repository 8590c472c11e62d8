package verbs

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"syscall"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
)

// DmabufExporter is implemented by GPU buffers that can export their memory
// as a dmabuf file descriptor (cuMemGetHandleForAddressRange). The verbs
// channel registers such memory with ibv_reg_dmabuf_mr; other device memory
// is registered by pointer, which needs a peer-memory driver
// (nvidia-peermem).
type DmabufExporter interface {
	// DmabufFD returns a dmabuf fd covering [Ptr()+off, Ptr()+off+n) and the
	// offset of that range within the dmabuf. The caller closes fd.
	DmabufFD(off, n int) (fd int, dmabufOffset uint64, err error)
}

// dmabufOf returns a dmabuf fd covering [off, off+n) of buf and the offset
// of that range in the dmabuf: through the buffer's own DmabufExporter, or,
// for memory's CUDA buffers, a dmabuf of their whole allocation.
func dmabufOf(buf memory.Buffer, off, n int) (int, uint64, error) {
	if x, ok := buf.(DmabufExporter); ok {
		return x.DmabufFD(off, n)
	}
	fd, boff, _, err := memory.DmaBuf(buf)
	if err != nil {
		return -1, 0, err
	}
	return fd, uint64(boff + off), nil
}

// regBuffer registers n bytes of buf from off.
func regBuffer(pd *ibverbs.PD, buf memory.Buffer, off, n int, access ibverbs.Access) (*ibverbs.MR, error) {
	if err := memory.CheckRange(off, n, buf.Len()); err != nil {
		return nil, err
	}
	addr := buf.Ptr() + uintptr(off)
	if buf.Device().IsHost() {
		return pd.RegMR(addr, n, access)
	}
	if ibverbs.DmabufSupported() {
		if fd, doff, err := dmabufOf(buf, off, n); err == nil {
			mr, err := pd.RegDmabufMR(doff, n, uint64(addr), fd, access)
			closeFD(fd)
			if err == nil {
				return mr, nil
			}
		}
	}
	mr, err := pd.RegMR(addr, n, access)
	if err != nil {
		return nil, fmt.Errorf("registering %s memory (no dmabuf, and peer memory failed): %w", buf.Device(), err)
	}
	return mr, nil
}

// randomPSN returns a random 24-bit packet sequence number.
func randomPSN() uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0x123456
	}
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

func closeFD(fd int) { _ = syscall.Close(fd) }
