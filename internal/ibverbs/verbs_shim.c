//go:build linux && cgo && !noibverbs

// verbs_shim.c: see verbs_shim.h. Only the ops-table inlines of the header
// (ibv_post_send, ibv_poll_cq, verbs_get_ctx_op) are used directly; every
// library function goes through a pointer from dlvsym.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_shim.h"

#ifdef TF_HAVE_VERBS_H

static struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	__be64 (*get_device_guid)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	ssize_t (*query_gid_table)(struct ibv_context *, struct ibv_gid_entry *, size_t, uint32_t, size_t);
	int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t, size_t);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	int (*dereg_mr)(struct ibv_mr *);
	const char *(*wc_status_str)(enum ibv_wc_status);
} fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_err[512];
static int load_rc = -1;

// sym resolves name at the given symbol version, falling back to the
// default version.
static void *sym(void *h, const char *name, const char *version) {
	void *p = NULL;
	if (version != NULL) {
		p = dlvsym(h, name, version);
	}
	if (p == NULL) {
		p = dlsym(h, name);
	}
	return p;
}

#define NEED(field, name, version)                                                   \
	do {                                                                         \
		*(void **)(&fn.field) = sym(h, name, version);                        \
		if (fn.field == NULL) {                                              \
			snprintf(load_err, sizeof load_err, "libibverbs.so.1 lacks %s", name); \
			dlclose(h);                                                  \
			return;                                                      \
		}                                                                    \
	} while (0)

static void load(void) {
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(load_err, sizeof load_err, "%s", e ? e : "dlopen libibverbs.so.1 failed");
		return;
	}
	NEED(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	NEED(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	NEED(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
	NEED(get_device_guid, "ibv_get_device_guid", "IBVERBS_1.1");
	NEED(open_device, "ibv_open_device", "IBVERBS_1.1");
	NEED(close_device, "ibv_close_device", "IBVERBS_1.1");
	NEED(query_device, "ibv_query_device", "IBVERBS_1.1");
	NEED(query_port, "ibv_query_port", "IBVERBS_1.1");
	NEED(query_gid, "ibv_query_gid", "IBVERBS_1.1");
	NEED(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	NEED(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	NEED(create_cq, "ibv_create_cq", "IBVERBS_1.1");
	NEED(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
	NEED(create_qp, "ibv_create_qp", "IBVERBS_1.1");
	NEED(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
	NEED(query_qp, "ibv_query_qp", "IBVERBS_1.1");
	NEED(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
	NEED(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	NEED(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	NEED(wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1");
	// Optional: GID types (rdma-core >= 32) and dmabuf (rdma-core >= 34).
	*(void **)(&fn.query_gid_ex) = sym(h, "_ibv_query_gid_ex", "IBVERBS_1.11");
	*(void **)(&fn.query_gid_table) = sym(h, "_ibv_query_gid_table", "IBVERBS_1.11");
	*(void **)(&fn.reg_dmabuf_mr) = sym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
	load_rc = 0;
}

int tf_ibv_load(char *err, size_t errlen) {
	pthread_once(&once, load);
	if (load_rc != 0 && err != NULL && errlen > 0) {
		snprintf(err, errlen, "%s", load_err);
	}
	return load_rc;
}

struct ibv_device **tf_get_device_list(int *num) { return fn.get_device_list(num); }
void tf_free_device_list(struct ibv_device **list) { fn.free_device_list(list); }
struct ibv_device *tf_device_at(struct ibv_device **list, int i) { return list[i]; }
const char *tf_get_device_name(struct ibv_device *dev) { return fn.get_device_name(dev); }
uint64_t tf_get_device_guid(struct ibv_device *dev) { return be64toh(fn.get_device_guid(dev)); }
struct ibv_context *tf_open_device(struct ibv_device *dev) { return fn.open_device(dev); }
int tf_close_device(struct ibv_context *ctx) { return fn.close_device(ctx); }
int tf_query_device(struct ibv_context *ctx, struct tf_device_attr *out) {
	struct ibv_device_attr a;
	int rc;
	memset(&a, 0, sizeof a);
	rc = fn.query_device(ctx, &a);
	if (rc != 0) {
		return rc;
	}
	memset(out, 0, sizeof *out);
	memcpy(out->fw_ver, a.fw_ver, sizeof out->fw_ver);
	out->fw_ver[sizeof out->fw_ver - 1] = 0;
	out->max_mr_size = a.max_mr_size;
	out->max_qp = a.max_qp;
	out->max_qp_wr = a.max_qp_wr;
	out->max_sge = a.max_sge;
	out->max_cqe = a.max_cqe;
	out->max_mr = a.max_mr;
	out->max_qp_rd_atom = a.max_qp_rd_atom;
	out->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	out->phys_port_cnt = a.phys_port_cnt;
	out->device_cap_flags = (uint32_t)a.device_cap_flags;
	return 0;
}

// tf_query_port does what the header's ___ibv_query_port does: the extended
// op when the provider has one, else the compat symbol.
int tf_query_port(struct ibv_context *ctx, uint8_t port, struct tf_port_attr *out) {
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	struct ibv_port_attr a;
	int rc;
	memset(&a, 0, sizeof a);
	if (vctx == NULL) {
		rc = fn.query_port(ctx, port, (struct _compat_ibv_port_attr *)&a);
	} else {
		rc = vctx->query_port(ctx, port, &a, sizeof a);
	}
	if (rc != 0) {
		return rc;
	}
	memset(out, 0, sizeof *out);
	out->state = a.state;
	out->max_mtu = a.max_mtu;
	out->active_mtu = a.active_mtu;
	out->gid_tbl_len = a.gid_tbl_len;
	out->lid = a.lid;
	out->link_layer = a.link_layer;
	return 0;
}

int tf_query_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t gid[16]) {
	union ibv_gid g;
	int rc = fn.query_gid(ctx, port, index, &g);
	if (rc == 0) {
		memcpy(gid, g.raw, 16);
	}
	return rc;
}

// tf_query_gid_table reads the valid GID entries of one port: up to max
// entries into gids (16 bytes each), types and indexes. It returns the count,
// or -ENOSYS when the library has no GID table query, or -errno.
int tf_query_gid_table(struct ibv_context *ctx, uint8_t port, uint8_t *gids, uint32_t *types, int *indexes, int max) {
	struct ibv_gid_entry *e;
	ssize_t n, i;
	int k = 0;
	if (fn.query_gid_table == NULL) {
		return -ENOSYS;
	}
	e = calloc((size_t)(max > 0 ? max : 1) * 8, sizeof *e);
	if (e == NULL) {
		return -ENOMEM;
	}
	// The table covers every port: ask for room for several ports.
	n = fn.query_gid_table(ctx, e, (size_t)max * 8, 0, sizeof *e);
	if (n < 0) {
		int rc = (int)n;
		free(e);
		return rc < 0 ? rc : -EIO;
	}
	for (i = 0; i < n && k < max; i++) {
		if (e[i].port_num != port) {
			continue;
		}
		memcpy(gids + 16 * k, e[i].gid.raw, 16);
		types[k] = e[i].gid_type;
		indexes[k] = (int)e[i].gid_index;
		k++;
	}
	free(e);
	return k;
}

// tf_query_gid_type returns ENOSYS when the library cannot tell GID types.
int tf_query_gid_type(struct ibv_context *ctx, uint8_t port, int index, uint32_t *type) {
	struct ibv_gid_entry e;
	int rc;
	if (fn.query_gid_ex == NULL) {
		return ENOSYS;
	}
	memset(&e, 0, sizeof e);
	rc = fn.query_gid_ex(ctx, port, (uint32_t)index, &e, 0, sizeof e);
	if (rc == 0) {
		*type = e.gid_type;
	}
	return rc;
}

struct ibv_pd *tf_alloc_pd(struct ibv_context *ctx) { return fn.alloc_pd(ctx); }
int tf_dealloc_pd(struct ibv_pd *pd) { return fn.dealloc_pd(pd); }
struct ibv_cq *tf_create_cq(struct ibv_context *ctx, int cqe) {
	return fn.create_cq(ctx, cqe, NULL, NULL, 0);
}
int tf_destroy_cq(struct ibv_cq *cq) { return fn.destroy_cq(cq); }

struct ibv_qp *tf_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
			       uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = max_sge;
	return fn.create_qp(pd, &a);
}
uint32_t tf_qp_num(struct ibv_qp *qp) { return qp->qp_num; }
int tf_qp_to_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = (unsigned int)access;
	return fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int tf_qp_to_rtr(struct ibv_qp *qp, const struct tf_rtr *r) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)r->path_mtu;
	a.dest_qp_num = r->dest_qp_num;
	a.rq_psn = r->rq_psn;
	a.max_dest_rd_atomic = r->max_dest_rd_atomic;
	a.min_rnr_timer = r->min_rnr_timer;
	a.ah_attr.dlid = r->dlid;
	a.ah_attr.sl = r->sl;
	a.ah_attr.port_num = r->port_num;
	if (r->is_global) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.sgid_index = r->sgid_index;
		a.ah_attr.grh.hop_limit = r->hop_limit;
		a.ah_attr.grh.traffic_class = r->traffic_class;
		memcpy(a.ah_attr.grh.dgid.raw, r->dgid, 16);
	}
	return fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int tf_qp_to_rts(struct ibv_qp *qp, const struct tf_rts *r) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = r->timeout;
	a.retry_cnt = r->retry_cnt;
	a.rnr_retry = r->rnr_retry;
	a.sq_psn = r->sq_psn;
	a.max_rd_atomic = r->max_rd_atomic;
	return fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int tf_qp_to_err(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return fn.modify_qp(qp, &a, IBV_QP_STATE);
}
int tf_query_qp_state(struct ibv_qp *qp, int *state) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc;
	memset(&a, 0, sizeof a);
	rc = fn.query_qp(qp, &a, IBV_QP_STATE, &ia);
	if (rc == 0) {
		*state = a.qp_state;
	}
	return rc;
}
int tf_destroy_qp(struct ibv_qp *qp) { return fn.destroy_qp(qp); }

struct ibv_mr *tf_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t length, int access) {
	return fn.reg_mr(pd, (void *)(uintptr_t)addr, length, access);
}
struct ibv_mr *tf_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				uint64_t iova, int fd, int access) {
	if (fn.reg_dmabuf_mr == NULL) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return fn.reg_dmabuf_mr(pd, offset, length, iova, fd, access);
}
int tf_have_dmabuf(void) { return fn.reg_dmabuf_mr != NULL; }
uint32_t tf_mr_lkey(struct ibv_mr *mr) { return mr->lkey; }
uint32_t tf_mr_rkey(struct ibv_mr *mr) { return mr->rkey; }
int tf_dereg_mr(struct ibv_mr *mr) { return fn.dereg_mr(mr); }
const char *tf_wc_status_str(uint32_t status) {
	return fn.wc_status_str((enum ibv_wc_status)status);
}

// Memory windows: ibv_alloc_mw and ibv_dealloc_mw are header inlines that
// call the provider's ops (EOPNOTSUPP / ENOSYS where it has none).
struct ibv_mw *tf_alloc_mw_type2(struct ibv_pd *pd) { return ibv_alloc_mw(pd, IBV_MW_TYPE_2); }
int tf_dealloc_mw(struct ibv_mw *mw) { return ibv_dealloc_mw(mw); }
uint32_t tf_mw_rkey(struct ibv_mw *mw) { return mw->rkey; }

// tf_post_bind_mw posts a signaled IBV_WR_BIND_MW binding the type-2 window
// mw to [addr, addr+length) of mr with the given access and new rkey (the
// window's rkey with its key byte changed, ibv_inc_rkey).
int tf_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		    uint64_t addr, uint64_t length, int access, uint32_t rkey) {
	struct ibv_send_wr wr, *bad = NULL;
	int rc;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = length;
	wr.bind_mw.bind_info.mw_access_flags = (unsigned int)access;
	rc = ibv_post_send(qp, &wr, &bad);
	if (rc == 0) {
		// As ibv_bind_mw does: providers (rxe) pass the window's current
		// rkey with the next bind, and the kernel refuses a stale one.
		mw->rkey = rkey;
	}
	return rc;
}

// tf_post_local_inv posts a signaled IBV_WR_LOCAL_INV of rkey (a window's).
int tf_post_local_inv(struct ibv_qp *qp, uint64_t wr_id, uint32_t rkey) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

// tf_post_reads posts n RDMA READs as one linked list. On failure *bad is
// the index of the first request not posted.
int tf_post_reads(struct ibv_qp *qp, struct tf_read *reqs, int n, int *bad) {
	struct ibv_send_wr *wrs;
	struct ibv_sge *sges;
	struct ibv_send_wr *bad_wr = NULL;
	int i, rc;
	*bad = 0;
	if (n <= 0) {
		return 0;
	}
	wrs = calloc((size_t)n, sizeof *wrs);
	sges = calloc((size_t)n, sizeof *sges);
	if (wrs == NULL || sges == NULL) {
		free(wrs);
		free(sges);
		return ENOMEM;
	}
	for (i = 0; i < n; i++) {
		sges[i].addr = reqs[i].laddr;
		sges[i].length = reqs[i].length;
		sges[i].lkey = reqs[i].lkey;
		wrs[i].wr_id = reqs[i].wr_id;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
		wrs[i].opcode = IBV_WR_RDMA_READ;
		wrs[i].send_flags = reqs[i].signaled ? IBV_SEND_SIGNALED : 0;
		wrs[i].wr.rdma.remote_addr = reqs[i].raddr;
		wrs[i].wr.rdma.rkey = reqs[i].rkey;
	}
	rc = ibv_post_send(qp, wrs, &bad_wr);
	if (rc != 0) {
		*bad = bad_wr != NULL ? (int)(bad_wr - wrs) : 0;
	}
	free(wrs);
	free(sges);
	return rc;
}

int tf_poll_cq(struct ibv_cq *cq, struct tf_wc *out, int n) {
	struct ibv_wc wc[16];
	int got = 0;
	while (got < n) {
		int want = n - got < 16 ? n - got : 16;
		int i, k = ibv_poll_cq(cq, want, wc);
		if (k < 0) {
			return got > 0 ? got : k;
		}
		for (i = 0; i < k; i++) {
			out[got + i].wr_id = wc[i].wr_id;
			out[got + i].status = wc[i].status;
			out[got + i].opcode = wc[i].opcode;
			out[got + i].vendor_err = wc[i].vendor_err;
			out[got + i].byte_len = wc[i].byte_len;
			out[got + i].qp_num = wc[i].qp_num;
			out[got + i].pad = 0;
		}
		got += k;
		if (k < want) {
			break;
		}
	}
	return got;
}

#else // !TF_HAVE_VERBS_H: built without rdma-core's headers.

int tf_ibv_load(char *err, size_t errlen) {
	if (err != NULL && errlen > 0) {
		snprintf(err, errlen, "built without rdma-core headers (install libibverbs-dev and rebuild)");
	}
	return -1;
}

// Never called: tf_ibv_load fails first.
struct ibv_device **tf_get_device_list(int *num) { *num = 0; errno = ENOSYS; return NULL; }
void tf_free_device_list(struct ibv_device **list) { (void)list; }
struct ibv_device *tf_device_at(struct ibv_device **list, int i) { (void)list; (void)i; return NULL; }
const char *tf_get_device_name(struct ibv_device *dev) { (void)dev; return ""; }
uint64_t tf_get_device_guid(struct ibv_device *dev) { (void)dev; return 0; }
struct ibv_context *tf_open_device(struct ibv_device *dev) { (void)dev; errno = ENOSYS; return NULL; }
int tf_close_device(struct ibv_context *ctx) { (void)ctx; return ENOSYS; }
int tf_query_device(struct ibv_context *ctx, struct tf_device_attr *a) { (void)ctx; (void)a; return ENOSYS; }
int tf_query_port(struct ibv_context *ctx, uint8_t port, struct tf_port_attr *a) { (void)ctx; (void)port; (void)a; return ENOSYS; }
int tf_query_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t gid[16]) { (void)ctx; (void)port; (void)index; (void)gid; return ENOSYS; }
int tf_query_gid_table(struct ibv_context *ctx, uint8_t port, uint8_t *gids, uint32_t *types, int *indexes, int max) {
	(void)ctx; (void)port; (void)gids; (void)types; (void)indexes; (void)max;
	return -ENOSYS;
}
int tf_query_gid_type(struct ibv_context *ctx, uint8_t port, int index, uint32_t *type) { (void)ctx; (void)port; (void)index; (void)type; return ENOSYS; }
struct ibv_pd *tf_alloc_pd(struct ibv_context *ctx) { (void)ctx; errno = ENOSYS; return NULL; }
int tf_dealloc_pd(struct ibv_pd *pd) { (void)pd; return ENOSYS; }
struct ibv_cq *tf_create_cq(struct ibv_context *ctx, int cqe) { (void)ctx; (void)cqe; errno = ENOSYS; return NULL; }
int tf_destroy_cq(struct ibv_cq *cq) { (void)cq; return ENOSYS; }
struct ibv_qp *tf_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
			       uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge) {
	(void)pd; (void)scq; (void)rcq; (void)max_send_wr; (void)max_recv_wr; (void)max_sge;
	errno = ENOSYS;
	return NULL;
}
uint32_t tf_qp_num(struct ibv_qp *qp) { (void)qp; return 0; }
int tf_qp_to_init(struct ibv_qp *qp, uint8_t port, int access) { (void)qp; (void)port; (void)access; return ENOSYS; }
int tf_qp_to_rtr(struct ibv_qp *qp, const struct tf_rtr *r) { (void)qp; (void)r; return ENOSYS; }
int tf_qp_to_rts(struct ibv_qp *qp, const struct tf_rts *r) { (void)qp; (void)r; return ENOSYS; }
int tf_qp_to_err(struct ibv_qp *qp) { (void)qp; return ENOSYS; }
int tf_query_qp_state(struct ibv_qp *qp, int *state) { (void)qp; (void)state; return ENOSYS; }
int tf_destroy_qp(struct ibv_qp *qp) { (void)qp; return ENOSYS; }
struct ibv_mr *tf_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t length, int access) {
	(void)pd; (void)addr; (void)length; (void)access;
	errno = ENOSYS;
	return NULL;
}
struct ibv_mr *tf_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				uint64_t iova, int fd, int access) {
	(void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access;
	errno = ENOSYS;
	return NULL;
}
int tf_have_dmabuf(void) { return 0; }
uint32_t tf_mr_lkey(struct ibv_mr *mr) { (void)mr; return 0; }
uint32_t tf_mr_rkey(struct ibv_mr *mr) { (void)mr; return 0; }
int tf_dereg_mr(struct ibv_mr *mr) { (void)mr; return ENOSYS; }
const char *tf_wc_status_str(uint32_t status) { (void)status; return "unknown"; }
struct ibv_mw *tf_alloc_mw_type2(struct ibv_pd *pd) { (void)pd; errno = ENOSYS; return NULL; }
int tf_dealloc_mw(struct ibv_mw *mw) { (void)mw; return ENOSYS; }
uint32_t tf_mw_rkey(struct ibv_mw *mw) { (void)mw; return 0; }
int tf_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		    uint64_t addr, uint64_t length, int access, uint32_t rkey) {
	(void)qp; (void)mw; (void)mr; (void)wr_id; (void)addr; (void)length; (void)access; (void)rkey;
	return ENOSYS;
}
int tf_post_local_inv(struct ibv_qp *qp, uint64_t wr_id, uint32_t rkey) { (void)qp; (void)wr_id; (void)rkey; return ENOSYS; }
int tf_post_reads(struct ibv_qp *qp, struct tf_read *reqs, int n, int *bad) { (void)qp; (void)reqs; (void)n; *bad = 0; return ENOSYS; }
int tf_poll_cq(struct ibv_cq *cq, struct tf_wc *out, int n) { (void)cq; (void)out; (void)n; return -ENOSYS; }

#endif
