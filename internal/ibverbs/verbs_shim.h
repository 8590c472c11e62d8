// verbs_shim.h declares the C side of package ibverbs: libibverbs is opened
// with dlopen at run time and every entry point is called through a pointer
// resolved with dlvsym, so the binary neither links against nor needs
// rdma-core. The struct layouts come from rdma-core's <infiniband/verbs.h>.
#ifndef TF_VERBS_SHIM_H
#define TF_VERBS_SHIM_H

#include <stddef.h>
#include <stdint.h>

// rdma-core's header gives the struct layouts. Without it (or with
// TF_NO_VERBS_H defined) the package still builds, and tf_ibv_load fails
// with the reason, so the binary runs without RDMA.
#if !defined(TF_NO_VERBS_H) && defined(__has_include)
#if __has_include(<infiniband/verbs.h>)
#define TF_HAVE_VERBS_H 1
#endif
#endif

#ifdef TF_HAVE_VERBS_H
#include <infiniband/verbs.h>
#else
struct ibv_device;
struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;
struct ibv_mw;
#endif

// Flat copies of the verbs structs the Go side reads or fills, so that Go
// never needs the header's layouts.
struct tf_device_attr {
	char fw_ver[64];
	uint64_t max_mr_size;
	int32_t max_qp, max_qp_wr, max_sge, max_cqe, max_mr;
	int32_t max_qp_rd_atom, max_qp_init_rd_atom;
	int32_t phys_port_cnt;
	uint32_t device_cap_flags;
};

struct tf_port_attr {
	uint32_t state, max_mtu, active_mtu;
	int32_t gid_tbl_len;
	uint16_t lid;
	uint8_t link_layer;
};

struct tf_rtr {
	uint32_t path_mtu, dest_qp_num, rq_psn;
	uint16_t dlid;
	uint8_t max_dest_rd_atomic, min_rnr_timer, sl, port_num;
	uint8_t is_global, sgid_index, hop_limit, traffic_class;
	uint8_t dgid[16];
};

struct tf_rts {
	uint32_t sq_psn;
	uint8_t timeout, retry_cnt, rnr_retry, max_rd_atomic;
};

// tf_ibv_load opens libibverbs.so.1 and resolves its symbols once. It returns
// 0, or -1 with a reason in err.
int tf_ibv_load(char *err, size_t errlen);

// tf_read is one RDMA READ work request.
struct tf_read {
	uint64_t wr_id;
	uint64_t laddr;
	uint64_t raddr;
	uint32_t length;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t signaled;
};

// tf_wc is the part of a work completion the Go side uses.
struct tf_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t pad;
};

struct ibv_device **tf_get_device_list(int *num);
void tf_free_device_list(struct ibv_device **list);
struct ibv_device *tf_device_at(struct ibv_device **list, int i);
const char *tf_get_device_name(struct ibv_device *dev);
uint64_t tf_get_device_guid(struct ibv_device *dev);
struct ibv_context *tf_open_device(struct ibv_device *dev);
int tf_close_device(struct ibv_context *ctx);
int tf_query_device(struct ibv_context *ctx, struct tf_device_attr *attr);
int tf_query_port(struct ibv_context *ctx, uint8_t port, struct tf_port_attr *attr);
int tf_query_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t gid[16]);
int tf_query_gid_table(struct ibv_context *ctx, uint8_t port, uint8_t *gids, uint32_t *types, int *indexes, int max);
int tf_query_gid_type(struct ibv_context *ctx, uint8_t port, int index, uint32_t *type);
struct ibv_pd *tf_alloc_pd(struct ibv_context *ctx);
int tf_dealloc_pd(struct ibv_pd *pd);
struct ibv_cq *tf_create_cq(struct ibv_context *ctx, int cqe);
int tf_destroy_cq(struct ibv_cq *cq);
struct ibv_qp *tf_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
			       uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge);
uint32_t tf_qp_num(struct ibv_qp *qp);
int tf_qp_to_init(struct ibv_qp *qp, uint8_t port, int access);
int tf_qp_to_rtr(struct ibv_qp *qp, const struct tf_rtr *r);
int tf_qp_to_rts(struct ibv_qp *qp, const struct tf_rts *r);
int tf_qp_to_err(struct ibv_qp *qp);
int tf_query_qp_state(struct ibv_qp *qp, int *state);
int tf_destroy_qp(struct ibv_qp *qp);
struct ibv_mr *tf_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t length, int access);
struct ibv_mr *tf_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				uint64_t iova, int fd, int access);
int tf_have_dmabuf(void);
uint32_t tf_mr_lkey(struct ibv_mr *mr);
uint32_t tf_mr_rkey(struct ibv_mr *mr);
int tf_dereg_mr(struct ibv_mr *mr);
const char *tf_wc_status_str(uint32_t status);
struct ibv_mw *tf_alloc_mw_type2(struct ibv_pd *pd);
int tf_dealloc_mw(struct ibv_mw *mw);
uint32_t tf_mw_rkey(struct ibv_mw *mw);
int tf_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		    uint64_t addr, uint64_t length, int access, uint32_t rkey);
int tf_post_local_inv(struct ibv_qp *qp, uint64_t wr_id, uint32_t rkey);
int tf_post_reads(struct ibv_qp *qp, struct tf_read *reqs, int n, int *bad);
int tf_poll_cq(struct ibv_cq *cq, struct tf_wc *out, int n);

#endif
