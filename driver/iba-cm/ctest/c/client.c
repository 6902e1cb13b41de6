/*
 * A kernel CM client written as WinVerbs (core/winverbs/kernel/wv_ep.c) and ndfltr
 * (core/ndfltr/kernel/nd_ep.cpp) use iba_cm: each endpoint has a spin lock held across
 * create_id/send_req/send_rep/listen/get_request (as their queue locks), its callback
 * takes the same lock, get_request's id gets its callback and context rewritten under the
 * lock (wv_ep.c:1149-1151), ndfltr-style accepts use format_rep + send_formatted_rep, and
 * destroy_id/send_drep run at PASSIVE_LEVEL without the lock.
 *
 * The lock notes a callback that finds its own thread holding it (it would deadlock in
 * the kernel) instead of spinning forever; the tests assert it never happens.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ib_cm_ifc_min.h"

#define STATUS_SUCCESS ((NTSTATUS)0)
#define STATUS_UNSUCCESSFUL ((NTSTATUS)0xC0000001u)

static uint16_t h16(uint16_t v) { return __builtin_bswap16(v); }
static uint32_t h32(uint32_t v) { return __builtin_bswap32(v); }
static uint64_t h64(uint64_t v) { return __builtin_bswap64(v); }

/* What the harness tells the client about its thread. */
typedef struct host_ops {
    void *ctx;
    int (*is_dispatch)(void *ctx);
} host_ops;

/* One delivered event, as the client saw it. */
typedef struct logged {
    int32_t type;
    uint32_t qpn;
    uint32_t qkey;
    uint16_t rej_reason;
    uint16_t alt_dlid;
    uint8_t resp_res;
    uint8_t init_depth;
    uint8_t pdata_len;
    uint8_t pdata0;
    uint8_t ari_len;
    uint8_t ari0;
    uint8_t service_timeout;
    uint8_t status;
    uint8_t at_dispatch;
    uint8_t reserved[3];
} logged;

typedef struct cep_stats {
    int32_t nlog;
    int32_t notifications;
    int32_t bad_notifications;
    int32_t recursions;
    int32_t callbacks_after_destroy;
    int32_t notifications_not_at_dispatch;
} cep_stats;

typedef struct cep {
    const INFINIBAND_INTERFACE_CM *ifc;
    const host_ops *host;
    volatile int lock;
    volatile uintptr_t owner;
    iba_cm_id *id;
    int32_t fail_on;
    int32_t destroy_on;
    int destroyed;
    cep_stats stats;
    logged log[32];
} cep;

static uintptr_t me(void) { return (uintptr_t)pthread_self(); }

/* Takes the lock; returns 0 (and counts) if this thread already holds it. */
static int lock(cep *c) {
    if (c->owner == me()) {
        c->stats.recursions++;
        return 0;
    }
    while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE)) {
    }
    c->owner = me();
    return 1;
}

static void unlock(cep *c, int taken) {
    if (!taken) {
        return;
    }
    c->owner = 0;
    __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE);
}

cep *cep_new(const INFINIBAND_INTERFACE_CM *ifc, const host_ops *host) {
    cep *c = calloc(1, sizeof *c);
    if (c) {
        c->ifc = ifc;
        c->host = host;
        c->fail_on = -1;
        c->destroy_on = -1;
    }
    return c;
}

void cep_free(cep *c) { free(c); }

void cep_set_fail_on(cep *c, int32_t type) { c->fail_on = type; }
void cep_set_destroy_on(cep *c, int32_t type) { c->destroy_on = type; }
void cep_get_stats(const cep *c, cep_stats *out) { *out = c->stats; }
int cep_get_log(const cep *c, int32_t i, logged *out) {
    if (i < 0 || i >= c->stats.nlog) {
        return 0;
    }
    *out = c->log[i];
    return 1;
}
int cep_has_id(const cep *c) { return c->id != NULL; }

/* Events of `type` logged so far, read under the lock (other threads deliver). */
int32_t cep_count(cep *c, int32_t type) {
    int32_t n = 0;
    int taken = lock(c);
    for (int32_t i = 0; i < c->stats.nlog; i++) {
        n += c->log[i].type == type;
    }
    unlock(c, taken);
    return n;
}
uint32_t cep_cid(const cep *c) { return c->id ? h32(c->id->cid) : 0; }
void *cep_id_ptr(const cep *c) { return c->id; }

static void note(cep *c, const iba_cm_event *ev) {
    logged l;
    memset(&l, 0, sizeof l);
    l.type = ev->type;
    l.at_dispatch = (uint8_t)c->host->is_dispatch(c->host->ctx);
    switch (ev->type) {
    case iba_cm_rep_received:
        l.qpn = h32(ev->data.rep.rep.qpn);
        l.resp_res = ev->data.rep.rep.resp_res;
        l.init_depth = ev->data.rep.rep.init_depth;
        l.pdata_len = ev->data.rep.rep.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.rep.rep.p_pdata)[0];
        break;
    case iba_cm_rtu_received:
    case iba_cm_dreq_received:
    case iba_cm_drep_received:
        l.pdata_len = ev->data.rtu.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.rtu.p_pdata)[0];
        break;
    case iba_cm_rej_received:
        l.rej_reason = h16(ev->data.rej.reason);
        l.ari_len = ev->data.rej.ari_length;
        l.ari0 = ((const uint8_t *)ev->data.rej.ari)[0];
        l.pdata_len = ev->data.rej.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.rej.p_pdata)[0];
        break;
    case iba_cm_mra_received:
        l.service_timeout = ev->data.mra.service_timeout;
        break;
    case iba_cm_lap_received:
        l.alt_dlid = h16(ev->data.lap.p_alt_path->dlid);
        l.pdata_len = ev->data.lap.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.lap.p_pdata)[0];
        break;
    case iba_cm_apr_received:
        l.status = ev->data.apr.status;
        l.pdata_len = ev->data.apr.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.apr.p_pdata)[0];
        break;
    case iba_cm_sidr_rep_received:
        l.qpn = h32(ev->data.sidr_rep.qpn);
        l.qkey = h32(ev->data.sidr_rep.qkey);
        l.status = ev->data.sidr_rep.status;
        l.pdata_len = ev->data.sidr_rep.pdata_len;
        l.pdata0 = ((const uint8_t *)ev->data.sidr_rep.p_pdata)[0];
        break;
    default:
        break;
    }
    if (c->stats.nlog < 32) {
        c->log[c->stats.nlog++] = l;
    }
}

/* A connection's callback (WvEpIbCmHandler / ND_ENDPOINT::CmHandler). */
static NTSTATUS handler(iba_cm_id *id, iba_cm_event *ev) {
    cep *c = (cep *)id->context;
    int taken = lock(c);
    if (c->destroyed) {
        c->stats.callbacks_after_destroy++;
    }
    note(c, ev);
    unlock(c, taken);
    if (ev->type == c->destroy_on) {
        /* ibcm allows this (AL would deadlock): finished when the callback returns. */
        c->ifc->CM.destroy_id(id);
        c->id = NULL;
        c->destroyed = 1;
        return STATUS_SUCCESS;
    }
    if (ev->type == c->fail_on) {
        /* The id is destroyed and freed by the CM: forget it. */
        c->id = NULL;
        c->destroyed = 1;
        return STATUS_UNSUCCESSFUL;
    }
    return STATUS_SUCCESS;
}

/* A listen's callback: a zeroed req_received notification per request. */
static NTSTATUS listen_handler(iba_cm_id *id, iba_cm_event *ev) {
    static const uint8_t zero[sizeof ev->data];
    cep *c = (cep *)id->context;
    int taken = lock(c);
    c->stats.notifications++;
    if (ev->type != iba_cm_req_received || memcmp(&ev->data, zero, sizeof zero) != 0) {
        c->stats.bad_notifications++;
    }
    if (!c->host->is_dispatch(c->host->ctx)) {
        c->stats.notifications_not_at_dispatch++;
    }
    unlock(c, taken);
    /* Ignored by the CM (al_cm.c:101-111). */
    return STATUS_UNSUCCESSFUL;
}

NTSTATUS cep_listen(cep *c, uint64_t service_id, const void *buf, uint8_t len, uint8_t off) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.create_id(listen_handler, c, &c->id);
    if (s == STATUS_SUCCESS) {
        s = c->ifc->CM.listen(c->id, h64(service_id), (void *)buf, len, off);
    }
    unlock(c, taken);
    return s;
}

NTSTATUS cep_cancel_listen(cep *c) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.cancel_listen(c->id);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_create(cep *c) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.create_id(handler, c, &c->id);
    unlock(c, taken);
    return s;
}

/* WvEpConnect: create_id and send_req under the queue lock (wv_ep.c:641-647). */
NTSTATUS cep_connect(cep *c, uint64_t service_id, const ib_path_rec_t *primary,
                     const ib_path_rec_t *alt, uint32_t qpn, const void *pdata,
                     uint8_t pdata_len, uint8_t resp_res, uint8_t init_depth,
                     uint8_t max_cm_retries, uint8_t resp_timeout) {
    ib_path_rec_t p = *primary;
    ib_path_rec_t a;
    iba_cm_req req;
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.create_id(handler, c, &c->id);
    if (s != STATUS_SUCCESS) {
        unlock(c, taken);
        return s;
    }
    memset(&req, 0, sizeof req);
    req.service_id = h64(service_id);
    req.p_primary_path = &p;
    if (alt) {
        a = *alt;
        req.p_alt_path = &a;
    }
    req.qpn = h32(qpn);
    req.qp_type = IB_QPT_RELIABLE_CONN;
    /* WinVerbs passes a 32-bit random value: the CM keeps 24 bits. */
    req.starting_psn = h32(0xAB123456u);
    req.p_pdata = pdata;
    req.pdata_len = pdata_len;
    req.max_cm_retries = max_cm_retries;
    req.resp_res = resp_res;
    req.init_depth = init_depth;
    req.remote_resp_timeout = resp_timeout;
    req.local_resp_timeout = resp_timeout;
    req.rnr_retry_cnt = 7;
    req.retry_cnt = 7;
    s = c->ifc->CM.send_req(c->id, &req);
    unlock(c, taken);
    return s;
}

/* WvEpGetRequest: get_request, then the new id's callback and context rewritten. */
NTSTATUS cep_get_request(cep *listen, cep *child, iba_cm_event *ev) {
    iba_cm_id *id = NULL;
    int taken = lock(listen);
    NTSTATUS s = listen->ifc->CM.get_request(listen->id, &id, ev);
    if (s == STATUS_SUCCESS) {
        id->callback = handler;
        id->context = child;
        child->id = id;
    }
    unlock(listen, taken);
    return s;
}

/* ND_ENDPOINT::GetRequest: get_request_ex with the new endpoint's handler. */
NTSTATUS cep_get_request_ex(cep *listen, cep *child, iba_cm_event *ev) {
    iba_cm_id *id = NULL;
    int taken = lock(listen);
    NTSTATUS s = listen->ifc->CM.get_request_ex(listen->id, handler, child, &id, ev);
    if (s == STATUS_SUCCESS) {
        child->id = id;
    }
    unlock(listen, taken);
    return s;
}

/* The inherited callback and context of a get_request id, before the rewrite. */
int cep_probe_inherit(cep *listen, cep *child, iba_cm_event *ev, void **context,
                      int *same_callback) {
    iba_cm_id *id = NULL;
    int taken = lock(listen);
    NTSTATUS s = listen->ifc->CM.get_request(listen->id, &id, ev);
    if (s == STATUS_SUCCESS) {
        *context = id->context;
        *same_callback = id->callback == listen->id->callback;
        id->callback = handler;
        id->context = child;
        child->id = id;
    }
    unlock(listen, taken);
    return s;
}

NTSTATUS cep_accept(cep *c, uint32_t qpn, const void *pdata, uint8_t len, uint8_t resp_res,
                    uint8_t init_depth) {
    iba_cm_rep rep;
    int taken = lock(c);
    memset(&rep, 0, sizeof rep);
    rep.qpn = h32(qpn);
    rep.starting_psn = h32(0x00654321u);
    rep.p_pdata = pdata;
    rep.pdata_len = len;
    rep.resp_res = resp_res;
    rep.init_depth = init_depth;
    rep.rnr_retry_cnt = 7;
    NTSTATUS s = c->ifc->CM.send_rep(c->id, &rep);
    unlock(c, taken);
    return s;
}

/* ND_ENDPOINT::Accept: format_rep (the INIT attributes for the QP), then send. */
NTSTATUS cep_format_rep(cep *c, uint32_t qpn, const void *pdata, uint8_t len, uint8_t resp_res,
                        uint8_t init_depth, ib_qp_mod_t *init) {
    iba_cm_rep rep;
    int taken = lock(c);
    memset(&rep, 0, sizeof rep);
    rep.qpn = h32(qpn);
    rep.starting_psn = h32(0x00111111u);
    rep.p_pdata = pdata;
    rep.pdata_len = len;
    rep.resp_res = resp_res;
    rep.init_depth = init_depth;
    rep.rnr_retry_cnt = 7;
    NTSTATUS s = c->ifc->CM.format_rep(c->id, &rep, init);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_send_formatted_rep(cep *c) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.send_formatted_rep(c->id);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_rtu(cep *c, const void *pdata, uint8_t len) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.send_rtu(c->id, pdata, len);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_dreq(cep *c, const void *pdata, uint8_t len) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.send_dreq(c->id, pdata, len);
    unlock(c, taken);
    return s;
}

/* PASSIVE_LEVEL, without the lock (wv_ep.c:1061). */
NTSTATUS cep_drep(cep *c, const void *pdata, uint8_t len) {
    return c->ifc->CM.send_drep(c->id, pdata, len);
}

NTSTATUS cep_rej(cep *c, uint16_t reason, const void *ari, uint8_t ari_len, const void *pdata,
                 uint8_t len) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.send_rej(c->id, h16(reason), ari, ari_len, pdata, len);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_mra(cep *c, uint8_t service_timeout) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.send_mra(c->id, service_timeout, NULL, 0);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_lap(cep *c, const ib_path_rec_t *alt, const void *pdata, uint8_t len) {
    ib_path_rec_t a = *alt;
    iba_cm_lap lap;
    int taken = lock(c);
    memset(&lap, 0, sizeof lap);
    lap.p_alt_path = &a;
    lap.p_pdata = (void *)pdata;
    lap.pdata_len = len;
    NTSTATUS s = c->ifc->CM.send_lap(c->id, &lap);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_apr(cep *c, uint8_t status, const void *pdata, uint8_t len) {
    iba_cm_apr apr;
    int taken = lock(c);
    memset(&apr, 0, sizeof apr);
    apr.status = status;
    apr.p_pdata = (void *)pdata;
    apr.pdata_len = len;
    NTSTATUS s = c->ifc->CM.send_apr(c->id, &apr);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_sidr_req(cep *c, uint64_t service_id, const ib_path_rec_t *path, const void *pdata,
                      uint8_t len, uint32_t timeout_ms, uint8_t retries) {
    ib_path_rec_t p = *path;
    iba_cm_sidr_req req;
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.create_id(handler, c, &c->id);
    if (s == STATUS_SUCCESS) {
        memset(&req, 0, sizeof req);
        req.service_id = h64(service_id);
        req.p_path = &p;
        req.p_pdata = (void *)pdata;
        req.pdata_len = len;
        req.max_cm_retries = retries;
        req.timeout = timeout_ms;
        s = c->ifc->CM.send_sidr_req(c->id, &req);
    }
    unlock(c, taken);
    return s;
}

NTSTATUS cep_sidr_rep(cep *c, uint32_t qpn, uint32_t qkey, uint8_t status, const void *pdata,
                      uint8_t len) {
    iba_cm_sidr_rep rep;
    int taken = lock(c);
    memset(&rep, 0, sizeof rep);
    rep.qpn = h32(qpn);
    rep.qkey = h32(qkey);
    rep.status = status;
    rep.p_pdata = (void *)pdata;
    rep.pdata_len = len;
    NTSTATUS s = c->ifc->CM.send_sidr_rep(c->id, &rep);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_qp_attr(cep *c, uint32_t state, ib_qp_mod_t *attr) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.get_qp_attr(c->id, state, attr);
    unlock(c, taken);
    return s;
}

NTSTATUS cep_established(cep *c) {
    int taken = lock(c);
    NTSTATUS s = c->ifc->CM.established(c->id);
    unlock(c, taken);
    return s;
}

/* PASSIVE_LEVEL, without the lock. */
void cep_destroy(cep *c) {
    if (c->id) {
        c->ifc->CM.destroy_id(c->id);
        c->id = NULL;
        c->destroyed = 1;
    }
}

void ifc_reference(const INFINIBAND_INTERFACE_CM *ifc) {
    ifc->InterfaceHeader.InterfaceReference(ifc->InterfaceHeader.Context);
}

void ifc_dereference(const INFINIBAND_INTERFACE_CM *ifc) {
    ifc->InterfaceHeader.InterfaceDereference(ifc->InterfaceHeader.Context);
}

/* Calls a client may get wrong; each returns the status it got (at most 16). */
int ifc_bad_calls(const INFINIBAND_INTERFACE_CM *ifc, NTSTATUS *out) {
    uint8_t junk[64];
    iba_cm_id fake;
    iba_cm_id *id = NULL;
    iba_cm_event ev;
    iba_cm_req req;
    ib_qp_mod_t attr;
    int n = 0;
    memset(junk, 0x5a, sizeof junk);
    memset(&fake, 0, sizeof fake);
    memset(&req, 0, sizeof req);
    out[n++] = ifc->CM.create_id(handler, NULL, NULL);
    out[n++] = ifc->CM.send_rtu(&fake, NULL, 0);
    out[n++] = ifc->CM.send_rtu((iba_cm_id *)(junk + 3), NULL, 0);
    out[n++] = ifc->CM.create_id(handler, NULL, &id);
    out[n++] = ifc->CM.send_rtu(id, NULL, 5);
    out[n++] = ifc->CM.send_req(id, NULL);
    out[n++] = ifc->CM.send_req(id, &req); /* no primary path */
    out[n++] = ifc->CM.get_qp_attr(id, 0x40, &attr);
    out[n++] = ifc->CM.get_qp_attr(id, IB_QPS_RTR, NULL);
    out[n++] = ifc->CM.get_request(id, &id, NULL);
    out[n++] = ifc->CM.get_request(id, NULL, &ev);
    out[n++] = ifc->CM.listen(id, h64(0x0000000001060000ull), junk, 8, 4); /* short RDMA-CM header */
    out[n++] = ifc->CM.listen(id, h64(0x1234), junk, 8, 93);               /* offset beyond the REQ pdata */
    out[n++] = ifc->CM.send_rtu(id, NULL, 0); /* idle: wrong state */
    ifc->CM.destroy_id(id);
    ifc->CM.destroy_id(&fake);
    out[n++] = ifc->CM.send_rtu(id, NULL, 0); /* destroyed */
    return n;
}
