#define _POSIX_C_SOURCE 200809L
/*
 * tmpi's thin C shim over libfabric (cargo feature `ofi`).
 *
 * Most fi_* calls are static inline functions in libfabric's headers (they jump through the
 * provider's ops tables), so Rust cannot link to them. Each function here calls one of them
 * and passes only plain integers, pointers to opaque objects, and the small structs declared
 * below, whose layout this file owns: Rust never sees a libfabric struct. Every function
 * returns libfabric's own result (0 or a negative fi_errno) unchanged.
 */
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

/* What Rust reads of one fi_info (strings are owned by the fi_info). */
struct tofi_attrs {
    const char *prov_name;
    const char *fabric_name;
    const char *domain_name;
    uint64_t caps;
    uint64_t mode;
    uint64_t mr_mode;
    uint64_t mr_key_size;
    uint64_t mr_iov_limit;
    uint64_t max_msg_size;
    uint64_t inject_size;
    uint64_t mem_tag_format;
    uint64_t addr_format;
    uint64_t tx_size;
    uint64_t rx_size;
    uint64_t iov_limit;
    uint64_t threading;
};

/* One completion (from fi_cq_tagged_entry, or fi_cq_err_entry with err != 0). */
struct tofi_comp {
    void *ctx;
    uint64_t flags;
    uint64_t len;
    uint64_t tag;
    uint64_t data;
    uint64_t olen;
    int32_t err;
    int32_t prov_errno;
};

uint32_t tofi_version(void) { return fi_version(); }

const char *tofi_strerror(int code) { return fi_strerror(code); }

int tofi_getinfo(const char *prov, const char *node, uint64_t caps, uint64_t mode, uint64_t mr_mode,
                 struct fi_info **out) {
    struct fi_info *hints = fi_allocinfo();
    int ret;
    if (!hints)
        return -FI_ENOMEM;
    hints->caps = caps;
    hints->mode = mode;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = (int)mr_mode;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (prov) {
        hints->fabric_attr->prov_name = strdup(prov);
        if (!hints->fabric_attr->prov_name) {
            fi_freeinfo(hints);
            return -FI_ENOMEM;
        }
    }
    ret = fi_getinfo(FI_VERSION(1, 17), node, NULL, node ? FI_SOURCE : 0, hints, out);
    fi_freeinfo(hints);
    return ret;
}

void tofi_freeinfo(struct fi_info *info) { fi_freeinfo(info); }

struct fi_info *tofi_info_next(const struct fi_info *info) { return info->next; }

struct fi_info *tofi_info_dup(const struct fi_info *info) { return fi_dupinfo(info); }

void tofi_info_attrs(const struct fi_info *i, struct tofi_attrs *a) {
    memset(a, 0, sizeof(*a));
    a->prov_name = i->fabric_attr ? i->fabric_attr->prov_name : NULL;
    a->fabric_name = i->fabric_attr ? i->fabric_attr->name : NULL;
    a->domain_name = i->domain_attr ? i->domain_attr->name : NULL;
    a->caps = i->caps;
    a->mode = i->mode;
    a->addr_format = i->addr_format;
    if (i->domain_attr) {
        a->mr_mode = (uint64_t)(unsigned)i->domain_attr->mr_mode;
        a->mr_key_size = i->domain_attr->mr_key_size;
        a->mr_iov_limit = i->domain_attr->mr_iov_limit;
        a->threading = i->domain_attr->threading;
    }
    if (i->ep_attr) {
        a->max_msg_size = i->ep_attr->max_msg_size;
        a->mem_tag_format = i->ep_attr->mem_tag_format;
    }
    if (i->tx_attr) {
        a->inject_size = i->tx_attr->inject_size;
        a->tx_size = i->tx_attr->size;
        a->iov_limit = i->tx_attr->iov_limit;
    }
    if (i->rx_attr)
        a->rx_size = i->rx_attr->size;
}

int tofi_fabric(struct fi_info *info, struct fid_fabric **fabric) {
    return fi_fabric(info->fabric_attr, fabric, NULL);
}

int tofi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain) {
    return fi_domain(fabric, info, domain, NULL);
}

/* A tagged-format CQ; with `want_fd`, one that can be waited on through a file descriptor. */
int tofi_cq_open(struct fid_domain *domain, uint64_t size, int want_fd, struct fid_cq **cq) {
    struct fi_cq_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = size;
    attr.format = FI_CQ_FORMAT_TAGGED;
    attr.wait_obj = want_fd ? FI_WAIT_FD : FI_WAIT_NONE;
    return fi_cq_open(domain, &attr, cq, NULL);
}

int tofi_cq_wait_fd(struct fid_cq *cq, int *fd) { return fi_control(&cq->fid, FI_GETWAIT, fd); }

int tofi_trywait(struct fid_fabric *fabric, struct fid_cq *cq) {
    struct fid *fids[1] = {&cq->fid};
    return fi_trywait(fabric, fids, 1);
}

int tofi_av_open(struct fid_domain *domain, uint64_t count, struct fid_av **av) {
    struct fi_av_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.type = FI_AV_TABLE;
    attr.count = count;
    return fi_av_open(domain, &attr, av, NULL);
}

int tofi_av_insert(struct fid_av *av, const void *addr, uint64_t *fi_addr) {
    int n = fi_av_insert(av, addr, 1, fi_addr, 0, NULL);
    return n == 1 ? 0 : (n < 0 ? n : -FI_EADDRNOTAVAIL);
}

int tofi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_cq *cq, struct fid_av *av,
                  struct fid_ep **ep) {
    int ret = fi_endpoint(domain, info, ep, NULL);
    if (ret)
        return ret;
    ret = fi_ep_bind(*ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (!ret)
        ret = fi_ep_bind(*ep, &av->fid, 0);
    if (!ret)
        ret = fi_enable(*ep);
    if (ret) {
        fi_close(&(*ep)->fid);
        *ep = NULL;
    }
    return ret;
}

int tofi_getname(struct fid_ep *ep, void *addr, uint64_t *len) {
    size_t l = (size_t)*len;
    int ret = fi_getname(&ep->fid, addr, &l);
    *len = l;
    return ret;
}

int tofi_close_fabric(struct fid_fabric *f) { return fi_close(&f->fid); }
int tofi_close_domain(struct fid_domain *d) { return fi_close(&d->fid); }
int tofi_close_cq(struct fid_cq *c) { return fi_close(&c->fid); }
int tofi_close_av(struct fid_av *a) { return fi_close(&a->fid); }
int tofi_close_ep(struct fid_ep *e) { return fi_close(&e->fid); }
int tofi_close_mr(struct fid_mr *m) { return fi_close(&m->fid); }

int64_t tofi_tsend(struct fid_ep *ep, const void *buf, uint64_t len, void *desc, uint64_t dest, uint64_t tag,
                   void *ctx) {
    return fi_tsend(ep, buf, len, desc, dest, tag, ctx);
}

int64_t tofi_tinject(struct fid_ep *ep, const void *buf, uint64_t len, uint64_t dest, uint64_t tag) {
    return fi_tinject(ep, buf, len, dest, tag);
}

int64_t tofi_trecv(struct fid_ep *ep, void *buf, uint64_t len, void *desc, uint64_t src, uint64_t tag,
                   uint64_t ignore, void *ctx) {
    return fi_trecv(ep, buf, len, desc, src, tag, ignore, ctx);
}

/* fi_trecvmsg with one buffer (or none), for FI_PEEK, FI_CLAIM and FI_DISCARD. */
int64_t tofi_trecvmsg(struct fid_ep *ep, void *buf, uint64_t len, void *desc, uint64_t src, uint64_t tag,
                      uint64_t ignore, void *ctx, uint64_t flags) {
    struct iovec iov = {buf, (size_t)len};
    void *descs[1] = {desc};
    struct fi_msg_tagged msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = buf ? &iov : NULL;
    msg.desc = buf ? descs : NULL;
    msg.iov_count = buf ? 1 : 0;
    msg.addr = src;
    msg.tag = tag;
    msg.ignore = ignore;
    msg.context = ctx;
    return fi_trecvmsg(ep, &msg, flags);
}

int64_t tofi_cancel(struct fid_ep *ep, void *ctx) { return fi_cancel(&ep->fid, ctx); }

int64_t tofi_read(struct fid_ep *ep, void *buf, uint64_t len, void *desc, uint64_t src, uint64_t addr,
                  uint64_t key, void *ctx) {
    return fi_read(ep, buf, len, desc, src, addr, key, ctx);
}

/* Reads up to `count` completions into `out`. On -FI_EAVAIL, reads one error entry into out[0]
 * (err != 0) and returns 1. */
int64_t tofi_cq_read(struct fid_cq *cq, struct tofi_comp *out, uint64_t count) {
    struct fi_cq_tagged_entry e[16];
    ssize_t n;
    if (count > 16)
        count = 16;
    n = fi_cq_read(cq, e, count);
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err;
        memset(&err, 0, sizeof(err));
        n = fi_cq_readerr(cq, &err, 0);
        if (n < 0)
            return n;
        out[0].ctx = err.op_context;
        out[0].flags = err.flags;
        out[0].len = err.len;
        out[0].tag = err.tag;
        out[0].data = err.data;
        out[0].olen = err.olen;
        out[0].err = err.err ? err.err : FI_EOTHER;
        out[0].prov_errno = err.prov_errno;
        return 1;
    }
    for (ssize_t i = 0; i < n; i++) {
        out[i].ctx = e[i].op_context;
        out[i].flags = e[i].flags;
        out[i].len = e[i].len;
        out[i].tag = e[i].tag;
        out[i].data = e[i].data;
        out[i].olen = 0;
        out[i].err = 0;
        out[i].prov_errno = 0;
    }
    return n;
}

int tofi_mr_regv(struct fid_domain *domain, const struct iovec *iov, uint64_t count, uint64_t access,
                 uint64_t requested_key, uint64_t flags, uint64_t context, struct fid_mr **mr) {
    struct fi_mr_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.mr_iov = iov;
    attr.iov_count = (size_t)count;
    attr.access = access;
    attr.requested_key = requested_key;
    attr.context = (void *)(uintptr_t)context;
    attr.iface = FI_HMEM_SYSTEM;
    return fi_mr_regattr(domain, &attr, flags, mr);
}

uint64_t tofi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *tofi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

int tofi_mr_raw_attr(struct fid_mr *mr, uint64_t *base_addr, uint8_t *raw_key, uint64_t *key_size) {
    size_t ks = (size_t)*key_size;
    int ret = fi_mr_raw_attr(mr, base_addr, raw_key, &ks, 0);
    *key_size = ks;
    return ret;
}

int tofi_mr_bind_ep(struct fid_mr *mr, struct fid_ep *ep) { return fi_mr_bind(mr, &ep->fid, 0); }
int tofi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }

int tofi_mr_map_raw(struct fid_domain *domain, uint64_t base_addr, uint8_t *raw_key, uint64_t key_size,
                    uint64_t *key) {
    return fi_mr_map_raw(domain, base_addr, raw_key, (size_t)key_size, key, 0);
}

int tofi_mr_unmap_key(struct fid_domain *domain, uint64_t key) { return fi_mr_unmap_key(domain, key); }

/* The header values Rust mirrors, in the order of `CONSTANTS` in ffi.rs (checked by a test). */
uint64_t tofi_constant(uint32_t i) {
    static const uint64_t v[] = {
        FI_MSG, FI_RMA, FI_TAGGED, FI_READ, FI_WRITE, FI_RECV, FI_SEND, FI_REMOTE_READ, FI_REMOTE_WRITE,
        FI_DIRECTED_RECV, FI_SOURCE, FI_PEEK, FI_CLAIM, FI_DISCARD, FI_CONTEXT, FI_CONTEXT2,
        FI_MR_LOCAL, FI_MR_RAW, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY, FI_MR_MMU_NOTIFY,
        FI_MR_RMA_EVENT, FI_MR_ENDPOINT, FI_MR_HMEM, FI_ADDR_UNSPEC, FI_KEY_NOTAVAIL, FI_EAGAIN,
        FI_ENOMSG, FI_ECANCELED, FI_EAVAIL, FI_ETRUNC, FI_ENODATA, FI_EACCES, FI_EINVAL, FI_ENOKEY,
        FI_EKEYREJECTED, FI_EBADFLAGS, FI_ETOOSMALL, FI_ENOSYS, FI_EOPBADSTATE, FI_EBUSY, FI_ENOSPC,
        FI_EFAULT, FI_EOTHER, FI_ENOMEM, FI_RECV | FI_TAGGED, FI_REMOTE_CQ_DATA, FI_MULTI_RECV,
        FI_LOCAL_COMM, FI_REMOTE_COMM, FI_COLLECTIVE, FI_MR_COLLECTIVE,
    };
    return i < sizeof(v) / sizeof(v[0]) ? v[i] : UINT64_MAX - 1;
}
