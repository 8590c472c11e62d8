/* A stand-in for libcuda.so.1 with the CUDA driver API's signatures, over
 * host memory, for test_cuda.py: it checks that cuda.Driver passes each
 * argument as the real driver takes it. "Device memory" is host memory
 * the test registers (fake_register); an IPC handle names a registered
 * allocation; one context per device must be current for the calls that
 * need one, as with the real driver. Two devices, with peer access. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef struct { unsigned char reserved[64]; } CUipcMemHandle;

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_CONTEXT = 201, INVALID_DEVICE = 101, ALREADY_MAPPED = 208 };

static int inited;
static int ctxs[2] = {1, 2};
static CUcontext stack[8];
static int depth;

#define MAXA 16
static struct { CUdeviceptr base; size_t size; int legacy; uint64_t id; int open; } allocs[MAXA];
static int nallocs;
uint64_t fake_copies;

void fake_register(CUdeviceptr base, size_t size, int legacy) {
	allocs[nallocs].base = base;
	allocs[nallocs].size = size;
	allocs[nallocs].legacy = legacy;
	allocs[nallocs].id = 1000 + nallocs;
	nallocs++;
}

int fake_depth(void) { return depth; }
uint64_t fake_attr_queries;

static int find(CUdeviceptr p) {
	for (int i = 0; i < nallocs; i++)
		if (p >= allocs[i].base && p < allocs[i].base + allocs[i].size)
			return i;
	return -1;
}

CUresult cuInit(unsigned int flags) { if (flags) return INVALID_VALUE; inited = 1; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) {
	*s = e == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : e == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" :
	     e == ALREADY_MAPPED ? "CUDA_ERROR_ALREADY_MAPPED" : "CUDA_ERROR_UNKNOWN";
	return OK;
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 2; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal < 0 || ordinal > 1) return INVALID_DEVICE; *d = 40 + ordinal; return OK; }
CUresult cuDeviceGetUuid(unsigned char *u, CUdevice d) { for (int i = 0; i < 16; i++) u[i] = (unsigned char)(16 * i + d - 40); return OK; }
CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d) { snprintf(s, len, "0000:%02x:00.0", d - 40 + 0x18); return OK; }
CUresult cuDeviceCanAccessPeer(int *ok, CUdevice a, CUdevice b) { *ok = a != b; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = &ctxs[d - 40]; return OK; }
int fake_pushes;
CUresult cuCtxPushCurrent_v2(CUcontext c) { if (c != &ctxs[0] && c != &ctxs[1]) return INVALID_CONTEXT; stack[depth++] = c; fake_pushes++; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = depth ? stack[depth - 1] : NULL; return OK; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (!depth) return INVALID_CONTEXT; *c = stack[--depth]; return OK; }

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	int i = find(p);
	fake_attr_queries++;
	if (i < 0) return INVALID_VALUE;
	if (attr == 7) *(uint64_t *)data = allocs[i].id;
	else if (attr == 10) *(int *)data = allocs[i].legacy;
	else return INVALID_VALUE;
	return OK;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	int i;
	if (!depth) return INVALID_CONTEXT;
	if ((i = find(p)) < 0) return INVALID_VALUE;
	*base = allocs[i].base;
	*size = allocs[i].size;
	return OK;
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	int i = find(p);
	if (!depth) return INVALID_CONTEXT;
	if (i < 0 || allocs[i].base != p || !allocs[i].legacy) return INVALID_VALUE;
	memset(h, 0xab, sizeof *h);
	memcpy(h->reserved, &p, sizeof p);
	return OK;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
	CUdeviceptr base;
	int i;
	if (!depth) return INVALID_CONTEXT;
	if (flags != 1 || h.reserved[63] != 0xab) return INVALID_VALUE;
	memcpy(&base, h.reserved, sizeof base);
	if ((i = find(base)) < 0) return INVALID_VALUE;
	if (allocs[i].open) return ALREADY_MAPPED;
	allocs[i].open = 1;
	*p = base;
	return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	int i = find(p);
	if (!depth) return INVALID_CONTEXT;
	if (i < 0 || !allocs[i].open) return INVALID_VALUE;
	allocs[i].open = 0;
	return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	if (!depth) return INVALID_CONTEXT;
	if (s != (CUstream)0x5eed) return INVALID_VALUE;
	memcpy((void *)dst, (void *)src, n);
	fake_copies++;
	return OK;
}
CUresult cuStreamSynchronize(CUstream s) { return s == (CUstream)0x5eed ? OK : INVALID_VALUE; }
