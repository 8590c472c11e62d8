//go:build linux && cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The few driver types used, declared here so no CUDA header is needed.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char bytes[16]; } CUuuid;

// Every driver symbol used, once: Go-side name, exported symbol, required
// (1: loading fails without it; 0: the call fails with ErrMissingSymbol),
// parameter list. All return CUresult.
#define TF_SYMBOLS(X) \
	X(cuInit, "cuInit", 1, (unsigned int)) \
	X(cuGetErrorName, "cuGetErrorName", 1, (CUresult, const char **)) \
	X(cuDeviceGetCount, "cuDeviceGetCount", 1, (int *)) \
	X(cuDeviceGet, "cuDeviceGet", 1, (CUdevice *, int)) \
	X(cuDeviceGetUuid, "cuDeviceGetUuid_v2", 0, (CUuuid *, CUdevice)) \
	X(cuDeviceGetUuidV1, "cuDeviceGetUuid", 0, (CUuuid *, CUdevice)) \
	X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 1, (char *, int, CUdevice)) \
	X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 1, (int *, CUdevice, CUdevice)) \
	X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", 1, (size_t *, CUdevice)) \
	X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 1, (int *, int, CUdevice)) \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1, (CUcontext *, CUdevice)) \
	X(cuCtxSetCurrent, "cuCtxSetCurrent", 1, (CUcontext)) \
	X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 1, (CUcontext, unsigned int)) \
	X(cuMemGetInfo, "cuMemGetInfo_v2", 1, (size_t *, size_t *)) \
	X(cuMemAlloc, "cuMemAlloc_v2", 1, (CUdeviceptr *, size_t)) \
	X(cuMemFree, "cuMemFree_v2", 1, (CUdeviceptr)) \
	X(cuMemHostAlloc, "cuMemHostAlloc", 1, (void **, size_t, unsigned int)) \
	X(cuMemFreeHost, "cuMemFreeHost", 1, (void *)) \
	X(cuMemHostRegister, "cuMemHostRegister_v2", 1, (void *, size_t, unsigned int)) \
	X(cuMemHostUnregister, "cuMemHostUnregister", 1, (void *)) \
	X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", 1, (CUdeviceptr, const void *, size_t)) \
	X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", 1, (void *, CUdeviceptr, size_t)) \
	X(cuMemcpyDtoD, "cuMemcpyDtoD_v2", 1, (CUdeviceptr, CUdeviceptr, size_t)) \
	X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", 1, (CUdeviceptr, const void *, size_t, CUstream)) \
	X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", 1, (void *, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", 1, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 1, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream)) \
	X(cuMemsetD8Async, "cuMemsetD8Async", 1, (CUdeviceptr, unsigned char, size_t, CUstream)) \
	X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", 1, (CUdeviceptr *, size_t *, CUdeviceptr)) \
	X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 0, (void *, CUdeviceptr, size_t, int, unsigned long long)) \
	X(cuStreamCreate, "cuStreamCreate", 1, (CUstream *, unsigned int)) \
	X(cuStreamSynchronize, "cuStreamSynchronize", 1, (CUstream)) \
	X(cuStreamDestroy, "cuStreamDestroy_v2", 1, (CUstream)) \
	X(cuStreamWaitEvent, "cuStreamWaitEvent", 1, (CUstream, CUevent, unsigned int)) \
	X(cuEventCreate, "cuEventCreate", 1, (CUevent *, unsigned int)) \
	X(cuEventRecord, "cuEventRecord", 1, (CUevent, CUstream)) \
	X(cuEventSynchronize, "cuEventSynchronize", 1, (CUevent)) \
	X(cuEventQuery, "cuEventQuery", 1, (CUevent)) \
	X(cuEventElapsedTime, "cuEventElapsedTime", 1, (float *, CUevent, CUevent)) \
	X(cuEventDestroy, "cuEventDestroy_v2", 1, (CUevent)) \
	X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 1, (CUipcMemHandle *, CUdeviceptr)) \
	X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", 1, (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
	X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 1, (CUdeviceptr)) \
	X(cuModuleLoadDataEx, "cuModuleLoadDataEx", 1, (CUmodule *, const void *, unsigned int, int *, void **)) \
	X(cuModuleGetFunction, "cuModuleGetFunction", 1, (CUfunction *, CUmodule, const char *)) \
	X(cuModuleUnload, "cuModuleUnload", 1, (CUmodule)) \
	X(cuLaunchKernel, "cuLaunchKernel", 1, (CUfunction, unsigned int, unsigned int, unsigned int, \
		unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void **, void **))

#define TF_DECLARE(name, sym, req, args) static CUresult (*p_##name) args;
TF_SYMBOLS(TF_DECLARE)

struct tf_symbol { const char *sym; int required; void **fp; };
#define TF_ENTRY(name, sym, req, args) { sym, req, (void **)&p_##name },
static struct tf_symbol tf_table[] = { TF_SYMBOLS(TF_ENTRY) };

// Shim results carry these flags besides the CUresult.
#define TF_MISSING 0x20000000 // the entry point was not found
#define TF_CTXFAIL 0x40000000 // cuCtxSetCurrent failed; low bits: its code

// Driver enum values used.
#define TF_DMA_BUF_FD 1                      // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
#define TF_STREAM_NON_BLOCKING 1             // CU_STREAM_NON_BLOCKING
#define TF_JIT_ERROR_LOG_BUFFER 5            // CU_JIT_ERROR_LOG_BUFFER
#define TF_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES

// tf_load opens the driver and resolves the table. 0: ok; 1: dlopen failed
// (msg holds dlerror); 2: a required symbol is missing (msg holds it).
static int tf_load(char *msg, size_t msglen) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *e = dlerror();
		snprintf(msg, msglen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	for (size_t i = 0; i < sizeof(tf_table) / sizeof(tf_table[0]); i++) {
		*tf_table[i].fp = dlsym(lib, tf_table[i].sym);
		if (*tf_table[i].fp == NULL && tf_table[i].required) {
			snprintf(msg, msglen, "%s", tf_table[i].sym);
			for (size_t j = 0; j < sizeof(tf_table) / sizeof(tf_table[0]); j++) *tf_table[j].fp = NULL;
			dlclose(lib);
			return 2;
		}
	}
	return 0;
}

static const char *tf_error_name(int code) {
	const char *s = NULL;
	if (p_cuGetErrorName == NULL || p_cuGetErrorName(code, &s) != 0) return NULL;
	return s;
}

#define NEED(name) do { if (p_##name == NULL) return TF_MISSING; } while (0)
#define BIND(ctx) do { \
	if (p_cuCtxSetCurrent == NULL) return TF_MISSING; \
	CUresult r_ = p_cuCtxSetCurrent(ctx); \
	if (r_ != 0) return TF_CTXFAIL | r_; \
} while (0)

static int tf_init(void) { NEED(cuInit); return p_cuInit(0); }
static int tf_device_count(int *n) { NEED(cuDeviceGetCount); return p_cuDeviceGetCount(n); }
static int tf_device_get(CUdevice *d, int ordinal) { NEED(cuDeviceGet); return p_cuDeviceGet(d, ordinal); }
static int tf_device_uuid(unsigned char *out, CUdevice d) {
	CUuuid u;
	CUresult r;
	if (p_cuDeviceGetUuid != NULL) r = p_cuDeviceGetUuid(&u, d);
	else if (p_cuDeviceGetUuidV1 != NULL) r = p_cuDeviceGetUuidV1(&u, d); // drivers before CUDA 11.4
	else return TF_MISSING;
	if (r == 0) memcpy(out, u.bytes, 16);
	return r;
}
static int tf_device_pci(char *buf, int n, CUdevice d) { NEED(cuDeviceGetPCIBusId); return p_cuDeviceGetPCIBusId(buf, n, d); }
static int tf_can_access_peer(int *ok, CUdevice a, CUdevice b) { NEED(cuDeviceCanAccessPeer); return p_cuDeviceCanAccessPeer(ok, a, b); }
static int tf_total_mem(size_t *n, CUdevice d) { NEED(cuDeviceTotalMem); return p_cuDeviceTotalMem(n, d); }
static int tf_attribute(int *v, int attr, CUdevice d) { NEED(cuDeviceGetAttribute); return p_cuDeviceGetAttribute(v, attr, d); }
static int tf_primary_retain(CUcontext *c, CUdevice d) { NEED(cuDevicePrimaryCtxRetain); return p_cuDevicePrimaryCtxRetain(c, d); }

static int tf_enable_peer(CUcontext c, CUcontext peer) { BIND(c); NEED(cuCtxEnablePeerAccess); return p_cuCtxEnablePeerAccess(peer, 0); }
static int tf_mem_info(CUcontext c, size_t *f, size_t *t) { BIND(c); NEED(cuMemGetInfo); return p_cuMemGetInfo(f, t); }
static int tf_alloc(CUcontext c, CUdeviceptr *p, size_t n) { BIND(c); NEED(cuMemAlloc); return p_cuMemAlloc(p, n); }
static int tf_free(CUcontext c, CUdeviceptr p) { BIND(c); NEED(cuMemFree); return p_cuMemFree(p); }
static int tf_host_alloc(CUcontext c, void **p, size_t n, unsigned int fl) { BIND(c); NEED(cuMemHostAlloc); return p_cuMemHostAlloc(p, n, fl); }
static int tf_free_host(CUcontext c, void *p) { BIND(c); NEED(cuMemFreeHost); return p_cuMemFreeHost(p); }
static int tf_host_register(CUcontext c, uintptr_t p, size_t n, unsigned int fl) { BIND(c); NEED(cuMemHostRegister); return p_cuMemHostRegister((void *)p, n, fl); }
static int tf_host_unregister(CUcontext c, uintptr_t p) { BIND(c); NEED(cuMemHostUnregister); return p_cuMemHostUnregister((void *)p); }
static int tf_htod(CUcontext c, CUdeviceptr d, const void *h, size_t n) { BIND(c); NEED(cuMemcpyHtoD); return p_cuMemcpyHtoD(d, h, n); }
static int tf_dtoh(CUcontext c, void *h, CUdeviceptr d, size_t n) { BIND(c); NEED(cuMemcpyDtoH); return p_cuMemcpyDtoH(h, d, n); }
static int tf_dtod(CUcontext c, CUdeviceptr d, CUdeviceptr s, size_t n) { BIND(c); NEED(cuMemcpyDtoD); return p_cuMemcpyDtoD(d, s, n); }
static int tf_htod_async(CUcontext c, CUdeviceptr d, const void *h, size_t n, CUstream s) { BIND(c); NEED(cuMemcpyHtoDAsync); return p_cuMemcpyHtoDAsync(d, h, n, s); }
static int tf_dtoh_async(CUcontext c, void *h, CUdeviceptr d, size_t n, CUstream s) { BIND(c); NEED(cuMemcpyDtoHAsync); return p_cuMemcpyDtoHAsync(h, d, n, s); }
static int tf_dtod_async(CUcontext c, CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) { BIND(c); NEED(cuMemcpyDtoDAsync); return p_cuMemcpyDtoDAsync(d, s_, n, s); }
static int tf_peer_async(CUcontext c, CUdeviceptr d, CUcontext dc, CUdeviceptr s_, CUcontext sc, size_t n, CUstream s) {
	BIND(c); NEED(cuMemcpyPeerAsync); return p_cuMemcpyPeerAsync(d, dc, s_, sc, n, s);
}
// The *_wait shims enqueue on a stream and wait for it inside one cgo call,
// so Go host memory is used only while the call lasts. which: 0 the copy
// failed, 1 the synchronize failed.
static int tf_htod_wait(CUcontext c, CUdeviceptr d, const void *h, size_t n, CUstream s, int *which) {
	BIND(c); NEED(cuMemcpyHtoDAsync); NEED(cuStreamSynchronize);
	*which = 0; CUresult r = p_cuMemcpyHtoDAsync(d, h, n, s); if (r) return r;
	*which = 1; return p_cuStreamSynchronize(s);
}
static int tf_dtoh_wait(CUcontext c, void *h, CUdeviceptr d, size_t n, CUstream s, int *which) {
	BIND(c); NEED(cuMemcpyDtoHAsync); NEED(cuStreamSynchronize);
	*which = 0; CUresult r = p_cuMemcpyDtoHAsync(h, d, n, s); if (r) return r;
	*which = 1; return p_cuStreamSynchronize(s);
}
static int tf_memset8_async(CUcontext c, CUdeviceptr d, unsigned char v, size_t n, CUstream s) { BIND(c); NEED(cuMemsetD8Async); return p_cuMemsetD8Async(d, v, n, s); }
static int tf_addr_range(CUcontext c, CUdeviceptr *b, size_t *n, CUdeviceptr p) { BIND(c); NEED(cuMemGetAddressRange); return p_cuMemGetAddressRange(b, n, p); }
static int tf_dmabuf(CUcontext c, int *fd, CUdeviceptr p, size_t n) {
	BIND(c); NEED(cuMemGetHandleForAddressRange);
	return p_cuMemGetHandleForAddressRange(fd, p, n, TF_DMA_BUF_FD, 0);
}
static int tf_stream_create(CUcontext c, CUstream *s) { BIND(c); NEED(cuStreamCreate); return p_cuStreamCreate(s, TF_STREAM_NON_BLOCKING); }
static int tf_stream_sync(CUcontext c, CUstream s) { BIND(c); NEED(cuStreamSynchronize); return p_cuStreamSynchronize(s); }
static int tf_stream_destroy(CUcontext c, CUstream s) { BIND(c); NEED(cuStreamDestroy); return p_cuStreamDestroy(s); }
static int tf_stream_wait(CUcontext c, CUstream s, CUevent e) { BIND(c); NEED(cuStreamWaitEvent); return p_cuStreamWaitEvent(s, e, 0); }
static int tf_event_create(CUcontext c, CUevent *e, unsigned int fl) { BIND(c); NEED(cuEventCreate); return p_cuEventCreate(e, fl); }
static int tf_event_record(CUcontext c, CUevent e, CUstream s) { BIND(c); NEED(cuEventRecord); return p_cuEventRecord(e, s); }
static int tf_event_sync(CUcontext c, CUevent e) { BIND(c); NEED(cuEventSynchronize); return p_cuEventSynchronize(e); }
static int tf_event_query(CUcontext c, CUevent e) { BIND(c); NEED(cuEventQuery); return p_cuEventQuery(e); }
static int tf_event_elapsed(CUcontext c, float *ms, CUevent a, CUevent b) { BIND(c); NEED(cuEventElapsedTime); return p_cuEventElapsedTime(ms, a, b); }
static int tf_event_destroy(CUcontext c, CUevent e) { BIND(c); NEED(cuEventDestroy); return p_cuEventDestroy(e); }
static int tf_ipc_get(CUcontext c, unsigned char *out, CUdeviceptr p) {
	BIND(c); NEED(cuIpcGetMemHandle);
	CUipcMemHandle h;
	CUresult r = p_cuIpcGetMemHandle(&h, p);
	if (r == 0) memcpy(out, h.reserved, 64);
	return r;
}
static int tf_ipc_open(CUcontext c, CUdeviceptr *p, const unsigned char *in, unsigned int fl) {
	BIND(c); NEED(cuIpcOpenMemHandle);
	CUipcMemHandle h;
	memcpy(h.reserved, in, 64);
	return p_cuIpcOpenMemHandle(p, h, fl);
}
static int tf_ipc_close(CUcontext c, CUdeviceptr p) { BIND(c); NEED(cuIpcCloseMemHandle); return p_cuIpcCloseMemHandle(p); }

// tf_module_load JIT-compiles PTX (or loads a cubin), leaving the JIT error
// log in log on failure.
static int tf_module_load(CUcontext c, CUmodule *m, const char *image, char *log, size_t loglen) {
	BIND(c); NEED(cuModuleLoadDataEx);
	int opts[2] = { TF_JIT_ERROR_LOG_BUFFER, TF_JIT_ERROR_LOG_BUFFER_SIZE_BYTES };
	void *vals[2] = { log, (void *)(uintptr_t)loglen };
	log[0] = 0;
	return p_cuModuleLoadDataEx(m, image, 2, opts, vals);
}
static int tf_module_function(CUcontext c, CUfunction *f, CUmodule m, const char *name) { BIND(c); NEED(cuModuleGetFunction); return p_cuModuleGetFunction(f, m, name); }
static int tf_module_unload(CUcontext c, CUmodule m) { BIND(c); NEED(cuModuleUnload); return p_cuModuleUnload(m); }

#define TF_MAX_ARGS 64
// tf_launch builds the parameter array (void **) in C memory on this stack:
// params[i] points at slots[i], whose 8 bytes hold argument i by value.
static int tf_launch(CUcontext c, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
		unsigned long long *slots, int n) {
	BIND(c); NEED(cuLaunchKernel);
	void *params[TF_MAX_ARGS];
	if (n < 0 || n > TF_MAX_ARGS) return 1; // CUDA_ERROR_INVALID_VALUE
	unsigned long long copy[TF_MAX_ARGS];
	for (int i = 0; i < n; i++) { copy[i] = slots[i]; params[i] = &copy[i]; }
	return p_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, n > 0 ? params : NULL, NULL);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// MaxKernelArgs is the most parameters LaunchKernel passes.
const MaxKernelArgs = C.TF_MAX_ARGS

var (
	loadOnce sync.Once
	loadErr  error
)

// load opens the driver and calls cuInit once per process.
func load() error {
	loadOnce.Do(func() {
		var msg [512]C.char
		switch C.tf_load(&msg[0], C.size_t(len(msg))) {
		case 1:
			loadErr = fmt.Errorf("%w: dlopen libcuda.so.1: %s", ErrNoDriver, C.GoString(&msg[0]))
			return
		case 2:
			loadErr = fmt.Errorf("%w: libcuda.so.1 lacks symbol %s", ErrNoDriver, C.GoString(&msg[0]))
			return
		}
		if err := check("cuInit", C.tf_init()); err != nil {
			loadErr = err
		}
	})
	return loadErr
}

func errorName(code int) string {
	s := C.tf_error_name(C.int(code))
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// check turns a shim result into an error.
func check(call string, r C.int) error {
	code := int(r)
	switch {
	case code == 0:
		return nil
	case code&C.TF_MISSING != 0:
		return missingSymbol(call)
	case code&C.TF_CTXFAIL != 0:
		return newError("cuCtxSetCurrent (for "+call+")", code&^C.TF_CTXFAIL, errorName)
	}
	return newError(call, code, errorName)
}

// Init loads the driver and initializes it. It returns an error matching
// ErrNoDriver when libcuda.so.1 is absent and one matching ErrNoDevice when
// the driver sees no GPU. Every other function calls it, so calling it is
// only needed to probe.
func Init() error { return load() }

// DeviceCount returns the number of CUDA devices (0 with an ErrNoDevice
// error when there is no driver).
func DeviceCount() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.tf_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// device resolves an ordinal; ErrNoDevice (wrapped) when out of range.
func device(ordinal int) (C.CUdevice, error) {
	if err := load(); err != nil {
		return 0, err
	}
	n, err := DeviceCount()
	if err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= n {
		return 0, fmt.Errorf("%w: ordinal %d, %d devices", ErrNoDevice, ordinal, n)
	}
	var d C.CUdevice
	if err := check("cuDeviceGet", C.tf_device_get(&d, C.int(ordinal))); err != nil {
		return 0, err
	}
	return d, nil
}

// DeviceUUID returns the device's UUID as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
// xxxxxxxxxxxx", the form nvidia-smi and NVML print.
func DeviceUUID(ordinal int) (string, error) {
	d, err := device(ordinal)
	if err != nil {
		return "", err
	}
	var b [16]byte
	if err := check("cuDeviceGetUuid", C.tf_device_uuid((*C.uchar)(unsafe.Pointer(&b[0])), d)); err != nil {
		return "", err
	}
	return formatUUID(b), nil
}

// DevicePCIBusID returns the PCI bus id, "dddd:bb:dd.f".
func DevicePCIBusID(ordinal int) (string, error) {
	d, err := device(ordinal)
	if err != nil {
		return "", err
	}
	var buf [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.tf_device_pci(&buf[0], C.int(len(buf)), d)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// CanAccessPeer reports whether device a can map memory of device b.
func CanAccessPeer(a, b int) (bool, error) {
	da, err := device(a)
	if err != nil {
		return false, err
	}
	db, err := device(b)
	if err != nil {
		return false, err
	}
	var ok C.int
	if err := check("cuDeviceCanAccessPeer", C.tf_can_access_peer(&ok, da, db)); err != nil {
		return false, err
	}
	return ok != 0, nil
}

// TotalMem returns the device's memory in bytes.
func TotalMem(ordinal int) (int64, error) {
	d, err := device(ordinal)
	if err != nil {
		return 0, err
	}
	var n C.size_t
	if err := check("cuDeviceTotalMem", C.tf_total_mem(&n, d)); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// DeviceGetAttribute returns a device attribute.
func DeviceGetAttribute(attr Attribute, ordinal int) (int, error) {
	d, err := device(ordinal)
	if err != nil {
		return 0, err
	}
	var v C.int
	if err := check("cuDeviceGetAttribute", C.tf_attribute(&v, C.int(attr), d)); err != nil {
		return 0, err
	}
	return int(v), nil
}

var (
	primaryMu sync.Mutex
	primaries = map[int]*Context{}
)

// Primary returns the primary context of a device, retained on first use
// and kept for the life of the process.
func Primary(ordinal int) (*Context, error) {
	primaryMu.Lock()
	defer primaryMu.Unlock()
	if c, ok := primaries[ordinal]; ok {
		return c, nil
	}
	d, err := device(ordinal)
	if err != nil {
		return nil, err
	}
	var h C.CUcontext
	if err := check("cuDevicePrimaryCtxRetain", C.tf_primary_retain(&h, d)); err != nil {
		return nil, err
	}
	c := &Context{ordinal: ordinal, dev: int32(d), h: unsafe.Pointer(h)}
	primaries[ordinal] = c
	return c, nil
}

func (c *Context) ch() C.CUcontext { return C.CUcontext(c.h) }

// EnablePeerAccess lets kernels and copies of this context address memory
// of peer's device directly. Enabling it twice is not an error.
func (c *Context) EnablePeerAccess(peer *Context) error {
	err := check("cuCtxEnablePeerAccess", C.tf_enable_peer(c.ch(), peer.ch()))
	if e, ok := err.(*Error); ok && e.Code == ErrorPeerAccessEnabled {
		return nil
	}
	return err
}

// MemGetInfo returns the free and total memory of the device in bytes.
func (c *Context) MemGetInfo() (free, total int64, err error) {
	var f, t C.size_t
	if err := check("cuMemGetInfo", C.tf_mem_info(c.ch(), &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// MemAlloc allocates n bytes of device memory (cuMemAlloc aligns to at least
// 256 bytes).
func (c *Context) MemAlloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, newError("cuMemAlloc", ErrorInvalidValue, errorName)
	}
	var p C.CUdeviceptr
	if err := check("cuMemAlloc", C.tf_alloc(c.ch(), &p, C.size_t(n))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// MemFree frees device memory from MemAlloc.
func (c *Context) MemFree(p DevicePtr) error {
	return check("cuMemFree", C.tf_free(c.ch(), C.CUdeviceptr(p)))
}

// MemHostAlloc allocates n bytes of page-locked host memory (C memory, not
// seen by the Go garbage collector) with HostAlloc* flags.
func (c *Context) MemHostAlloc(n int, flags int) (unsafe.Pointer, error) {
	if n <= 0 {
		return nil, newError("cuMemHostAlloc", ErrorInvalidValue, errorName)
	}
	var p unsafe.Pointer
	if err := check("cuMemHostAlloc", C.tf_host_alloc(c.ch(), &p, C.size_t(n), C.uint(flags))); err != nil {
		return nil, err
	}
	return p, nil
}

// MemFreeHost frees memory from MemHostAlloc.
func (c *Context) MemFreeHost(p unsafe.Pointer) error {
	return check("cuMemFreeHost", C.tf_free_host(c.ch(), p))
}

// MemHostRegister page-locks the host range [addr, addr+n) with
// HostRegister* flags. The memory must stay allocated, and must not move,
// until MemHostUnregister: C memory, or Go heap memory the caller keeps
// reachable for the whole registration.
func (c *Context) MemHostRegister(addr uintptr, n int, flags int) error {
	return check("cuMemHostRegister", C.tf_host_register(c.ch(), C.uintptr_t(addr), C.size_t(n), C.uint(flags)))
}

// MemHostUnregister undoes MemHostRegister of the range starting at addr.
func (c *Context) MemHostUnregister(addr uintptr) error {
	return check("cuMemHostUnregister", C.tf_host_unregister(c.ch(), C.uintptr_t(addr)))
}

// MemcpyHtoD copies n bytes from host memory (Go memory allowed) to the
// device and returns when done.
func (c *Context) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n int) error {
	return check("cuMemcpyHtoD", C.tf_htod(c.ch(), C.CUdeviceptr(dst), src, C.size_t(n)))
}

// MemcpyDtoH copies n bytes from the device to host memory (Go memory
// allowed) and returns when done.
func (c *Context) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n int) error {
	return check("cuMemcpyDtoH", C.tf_dtoh(c.ch(), dst, C.CUdeviceptr(src), C.size_t(n)))
}

// MemcpyDtoD copies n bytes between device pointers (of this or, with
// unified addressing, another device).
func (c *Context) MemcpyDtoD(dst, src DevicePtr, n int) error {
	return check("cuMemcpyDtoD", C.tf_dtod(c.ch(), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n)))
}

func (s *Stream) sh() C.CUstream {
	if s == nil {
		return nil
	}
	return C.CUstream(s.h)
}

// MemcpyHtoDAsync enqueues a host to device copy on s (nil: the default
// stream). src must be pinned C memory or registered memory kept alive until
// the stream is synchronized; pageable Go memory must use MemcpyHtoD or
// MemcpyHtoDWait.
func (c *Context) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n int, s *Stream) error {
	return check("cuMemcpyHtoDAsync", C.tf_htod_async(c.ch(), C.CUdeviceptr(dst), src, C.size_t(n), s.sh()))
}

// MemcpyDtoHAsync enqueues a device to host copy on s; the same rules as
// MemcpyHtoDAsync apply to dst.
func (c *Context) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n int, s *Stream) error {
	return check("cuMemcpyDtoHAsync", C.tf_dtoh_async(c.ch(), dst, C.CUdeviceptr(src), C.size_t(n), s.sh()))
}

// MemcpyDtoDAsync enqueues a device to device copy on s.
func (c *Context) MemcpyDtoDAsync(dst, src DevicePtr, n int, s *Stream) error {
	return check("cuMemcpyDtoDAsync", C.tf_dtod_async(c.ch(), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.sh()))
}

// MemcpyPeerAsync enqueues on s a copy from src in srcCtx's device to dst in
// dstCtx's device; it works with or without peer access (the driver stages
// through the host when needed).
func (c *Context) MemcpyPeerAsync(dst DevicePtr, dstCtx *Context, src DevicePtr, srcCtx *Context, n int, s *Stream) error {
	return check("cuMemcpyPeerAsync", C.tf_peer_async(c.ch(), C.CUdeviceptr(dst), dstCtx.ch(),
		C.CUdeviceptr(src), srcCtx.ch(), C.size_t(n), s.sh()))
}

// MemcpyHtoDWait enqueues a host to device copy on s and waits for s, in one
// call, so src may be ordinary Go memory. The copy is ordered after the work
// already on s.
func (c *Context) MemcpyHtoDWait(dst DevicePtr, src unsafe.Pointer, n int, s *Stream) error {
	var which C.int
	r := C.tf_htod_wait(c.ch(), C.CUdeviceptr(dst), src, C.size_t(n), s.sh(), &which)
	if which == 1 {
		return check("cuStreamSynchronize", r)
	}
	return check("cuMemcpyHtoDAsync", r)
}

// MemcpyDtoHWait is MemcpyHtoDWait's device to host counterpart.
func (c *Context) MemcpyDtoHWait(dst unsafe.Pointer, src DevicePtr, n int, s *Stream) error {
	var which C.int
	r := C.tf_dtoh_wait(c.ch(), dst, C.CUdeviceptr(src), C.size_t(n), s.sh(), &which)
	if which == 1 {
		return check("cuStreamSynchronize", r)
	}
	return check("cuMemcpyDtoHAsync", r)
}

// MemsetD8Async enqueues on s (nil: the default stream) the setting of n
// bytes of device memory to v. (The synchronous cuMemsetD8 may return before
// the memory is set and is not ordered with non-blocking streams, so only
// the stream-ordered form is offered.)
func (c *Context) MemsetD8Async(p DevicePtr, v byte, n int, s *Stream) error {
	if s != nil && s.h == nil {
		return ErrDestroyed
	}
	return check("cuMemsetD8Async", C.tf_memset8_async(c.ch(), C.CUdeviceptr(p), C.uchar(v), C.size_t(n), s.sh()))
}

// MemGetAddressRange returns the base and size of the allocation that
// contains p.
func (c *Context) MemGetAddressRange(p DevicePtr) (base DevicePtr, size int, err error) {
	var b C.CUdeviceptr
	var n C.size_t
	if err := check("cuMemGetAddressRange", C.tf_addr_range(c.ch(), &b, &n, C.CUdeviceptr(p))); err != nil {
		return 0, 0, err
	}
	return DevicePtr(b), int(n), nil
}

// MemGetHandleForAddressRange exports [p, p+size) as a dmabuf file
// descriptor (for ibv_reg_dmabuf_mr). p and size must be aligned to the host
// page size; the caller closes the fd. Needs a driver and device with
// AttrDmaBufSupported.
func (c *Context) MemGetHandleForAddressRange(p DevicePtr, size int) (fd int, err error) {
	var f C.int
	if err := check("cuMemGetHandleForAddressRange", C.tf_dmabuf(c.ch(), &f, C.CUdeviceptr(p), C.size_t(size))); err != nil {
		return -1, err
	}
	return int(f), nil
}

// NewStream creates a non-blocking stream (no implicit synchronization with
// the legacy default stream).
func (c *Context) NewStream() (*Stream, error) {
	var s C.CUstream
	if err := check("cuStreamCreate", C.tf_stream_create(c.ch(), &s)); err != nil {
		return nil, err
	}
	return &Stream{ctx: c, h: unsafe.Pointer(s)}, nil
}

// Synchronize waits until all work on the stream is done.
func (s *Stream) Synchronize() error {
	if s.h == nil {
		return ErrDestroyed
	}
	return check("cuStreamSynchronize", C.tf_stream_sync(s.ctx.ch(), s.sh()))
}

// WaitEvent makes later work on s wait for e (on the device; the host does
// not block).
func (s *Stream) WaitEvent(e *Event) error {
	if s.h == nil || e.h == nil {
		return ErrDestroyed
	}
	return check("cuStreamWaitEvent", C.tf_stream_wait(s.ctx.ch(), s.sh(), e.eh()))
}

// Destroy releases the stream; work already queued still completes.
func (s *Stream) Destroy() error {
	if s.h == nil {
		return ErrDestroyed
	}
	h := s.sh()
	s.h = nil
	return check("cuStreamDestroy", C.tf_stream_destroy(s.ctx.ch(), h))
}

func (e *Event) eh() C.CUevent { return C.CUevent(e.h) }

// NewEvent creates an event with Event* flags (EventDisableTiming for pure
// synchronization, which is cheaper).
func (c *Context) NewEvent(flags int) (*Event, error) {
	var e C.CUevent
	if err := check("cuEventCreate", C.tf_event_create(c.ch(), &e, C.uint(flags))); err != nil {
		return nil, err
	}
	return &Event{ctx: c, h: unsafe.Pointer(e)}, nil
}

// Record captures the work queued on s so far (nil: default stream).
func (e *Event) Record(s *Stream) error {
	if e.h == nil || (s != nil && s.h == nil) {
		return ErrDestroyed
	}
	return check("cuEventRecord", C.tf_event_record(e.ctx.ch(), e.eh(), s.sh()))
}

// Synchronize waits until the recorded work is done.
func (e *Event) Synchronize() error {
	if e.h == nil {
		return ErrDestroyed
	}
	return check("cuEventSynchronize", C.tf_event_sync(e.ctx.ch(), e.eh()))
}

// Query reports whether the recorded work is done, without blocking.
func (e *Event) Query() (bool, error) {
	if e.h == nil {
		return false, ErrDestroyed
	}
	r := C.tf_event_query(e.ctx.ch(), e.eh())
	if int(r) == ErrorNotReady {
		return false, nil
	}
	if err := check("cuEventQuery", r); err != nil {
		return false, err
	}
	return true, nil
}

// ElapsedTime returns the milliseconds between two recorded events (both
// created without EventDisableTiming).
func ElapsedTime(start, end *Event) (float32, error) {
	if start.h == nil || end.h == nil {
		return 0, ErrDestroyed
	}
	var ms C.float
	if err := check("cuEventElapsedTime", C.tf_event_elapsed(start.ctx.ch(), &ms, start.eh(), end.eh())); err != nil {
		return 0, err
	}
	return float32(ms), nil
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	if e.h == nil {
		return ErrDestroyed
	}
	h := e.eh()
	e.h = nil
	return check("cuEventDestroy", C.tf_event_destroy(e.ctx.ch(), h))
}

// IpcGetMemHandle returns an IPC handle for the allocation containing p
// (the handle names the whole allocation: send its base offset along).
func (c *Context) IpcGetMemHandle(p DevicePtr) (IpcMemHandle, error) {
	var h IpcMemHandle
	if err := check("cuIpcGetMemHandle", C.tf_ipc_get(c.ch(), (*C.uchar)(unsafe.Pointer(&h[0])), C.CUdeviceptr(p))); err != nil {
		return IpcMemHandle{}, err
	}
	return h, nil
}

// IpcOpenMemHandle maps another process's allocation into this context
// (flags: IpcLazyEnablePeerAccess). A handle is opened once per context;
// close it with IpcCloseMemHandle.
func (c *Context) IpcOpenMemHandle(h IpcMemHandle, flags int) (DevicePtr, error) {
	var p C.CUdeviceptr
	if err := check("cuIpcOpenMemHandle", C.tf_ipc_open(c.ch(), &p, (*C.uchar)(unsafe.Pointer(&h[0])), C.uint(flags))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func (c *Context) IpcCloseMemHandle(p DevicePtr) error {
	return check("cuIpcCloseMemHandle", C.tf_ipc_close(c.ch(), C.CUdeviceptr(p)))
}

// ModuleLoadData loads a module from PTX text (JIT-compiled for this
// device) or a cubin or fatbin image. A JIT failure's log is part of the
// error. The image is copied to C memory with a terminating NUL (PTX must
// end with one; binary images carry their own length), so it may hold NUL
// bytes and the caller may reuse it after the call.
func (c *Context) ModuleLoadData(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, newError("cuModuleLoadData", ErrorInvalidValue, errorName)
	}
	cs := (*C.char)(C.malloc(C.size_t(len(image) + 1)))
	defer C.free(unsafe.Pointer(cs))
	buf := unsafe.Slice((*byte)(unsafe.Pointer(cs)), len(image)+1)
	copy(buf, image)
	buf[len(image)] = 0
	var log [4096]C.char
	var m C.CUmodule
	if err := check("cuModuleLoadData", C.tf_module_load(c.ch(), &m, cs, &log[0], C.size_t(len(log)))); err != nil {
		if s := C.GoString(&log[0]); s != "" {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
		return nil, err
	}
	return &Module{ctx: c, h: unsafe.Pointer(m)}, nil
}

// Function returns the kernel called name.
func (m *Module) Function(name string) (*Function, error) {
	if m.h == nil {
		return nil, ErrDestroyed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f C.CUfunction
	if err := check("cuModuleGetFunction", C.tf_module_function(m.ctx.ch(), &f, C.CUmodule(m.h), cs)); err != nil {
		return nil, fmt.Errorf("%w (kernel %q)", err, name)
	}
	return &Function{mod: m, name: name, h: unsafe.Pointer(f)}, nil
}

// Unload unloads the module; its functions become invalid.
func (m *Module) Unload() error {
	if m.h == nil {
		return ErrDestroyed
	}
	h := C.CUmodule(m.h)
	m.h = nil
	return check("cuModuleUnload", C.tf_module_unload(m.ctx.ch(), h))
}

// LaunchKernel enqueues f on s (nil: default stream) with the given grid
// and block shape, dynamic shared memory bytes and parameters (at most
// MaxKernelArgs, each passed by value).
func (c *Context) LaunchKernel(f *Function, grid, block Dim3, sharedMem uint32, s *Stream, args ...KernelArg) error {
	if f == nil || f.h == nil || f.mod.h == nil {
		return ErrDestroyed
	}
	if len(args) > MaxKernelArgs {
		return fmt.Errorf("cuda: cuLaunchKernel: %d arguments, at most %d", len(args), MaxKernelArgs)
	}
	var slots [C.TF_MAX_ARGS]C.ulonglong
	for i, a := range args {
		slots[i] = C.ulonglong(a)
	}
	r := C.tf_launch(c.ch(), C.CUfunction(f.h), C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedMem), s.sh(), &slots[0], C.int(len(args)))
	runtime.KeepAlive(f)
	return check("cuLaunchKernel", r)
}
