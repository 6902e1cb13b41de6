/*
 * What the replays of WinVerbs (winverbs.c) and ndfltr (ndfltr.c) share: the host's IRQL
 * hooks, the queue spin lock (WdfObjectAcquireLock on a queue: DISPATCH_LEVEL), a fake QP
 * that keeps what the provider hands to its CA's modify-QP, and the test's record of the
 * events each endpoint's callback saw (instrumentation only: it changes no call).
 */
#ifndef IBCM_REPLAY_H
#define IBCM_REPLAY_H

#include <stdint.h>

#include "ib_cm_ifc_min.h"

#define STATUS_SUCCESS ((NTSTATUS)0)
#define STATUS_PENDING ((NTSTATUS)0x00000103)
#define STATUS_TIMEOUT ((NTSTATUS)0x00000102)
#define STATUS_UNSUCCESSFUL ((NTSTATUS)0xC0000001u)
#define STATUS_NOT_IMPLEMENTED ((NTSTATUS)0xC0000002u)
#define STATUS_INVALID_PARAMETER ((NTSTATUS)0xC000000Du)
#define STATUS_NOT_SUPPORTED ((NTSTATUS)0xC00000BBu)
#define STATUS_IO_TIMEOUT ((NTSTATUS)0xC00000B5u)
#define STATUS_INVALID_DEVICE_STATE ((NTSTATUS)0xC0000184u)
#define STATUS_CONNECTION_REFUSED ((NTSTATUS)0xC0000236u)
#define STATUS_CONNECTION_INVALID ((NTSTATUS)0xC000023Au)
#define STATUS_CONNECTION_ACTIVE ((NTSTATUS)0xC000023Bu)
#define STATUS_CONNECTION_ABORTED ((NTSTATUS)0xC0000241u)
#define STATUS_CONNECTION_DISCONNECTED ((NTSTATUS)0xC000020Cu)
#define STATUS_DEVICE_REMOVED ((NTSTATUS)0xC00002B6u)
#define NT_SUCCESS(s) ((NTSTATUS)(s) >= 0)

/* ib_rdma_cm.h:41-42, ib_types.h:12882-12888. */
#define IB_CMA_CM_RESPONSE_TIMEOUT 20
#define IB_CMA_MAX_CM_RETRIES 15
#define IB_REQ_CM_RDMA_VERSION 0x00
#define IB_REQ_CM_RDMA_IPV4 0x40
#define IB_REQ_CM_RDMA_PDATA_SIZE 56
/* ib_types.h IB_FAILOVER_ACCEPT_UNSUPPORTED. */
#define IB_FAILOVER_ACCEPT_UNSUPPORTED 1

static inline uint16_t rp_h16(uint16_t v) { return __builtin_bswap16(v); }
static inline uint32_t rp_h32(uint32_t v) { return __builtin_bswap32(v); }
static inline uint64_t rp_h64(uint64_t v) { return __builtin_bswap64(v); }

/* The RDMA CM header (ib_rdma_cm.h:55-63 IB_CMA_HEADER, ib_types.h:12917-12926
 * ib_cm_rdma_req_t): 36 bytes, IPv4 addresses in the last word of each 16. */
typedef struct rdma_cm_hdr {
    uint8_t version;
    uint8_t ip_version;
    uint16_t port; /* net order */
    uint32_t src[4];
    uint32_t dst[4];
} rdma_cm_hdr;
_Static_assert(sizeof(rdma_cm_hdr) == 36, "IB_CMA_HEADER");

/* What the test harness provides. */
typedef struct replay_host {
    void *ctx;
    int (*is_dispatch)(void *ctx);
    /* Runs fn(arg) at DISPATCH_LEVEL (what KeAcquireSpinLock raises to). */
    void (*at_dispatch)(void *ctx, void (*fn)(void *arg), void *arg);
} replay_host;

/* A queue's spin lock; a callback that finds its own thread holding it would deadlock in
 * the kernel: it is counted instead. */
typedef struct spin {
    volatile int held;
    volatile uintptr_t owner;
    int32_t recursions;
} spin;

int spin_acquire(spin *l);
void spin_release(spin *l, int taken);
/* WdfObjectAcquireLock .. WdfObjectReleaseLock around fn(arg), at DISPATCH_LEVEL. */
void locked(const replay_host *h, spin *l, void (*fn)(void *arg), void *arg);

/* The provider's QP: what it hands to ndi_modify_qp / ND_QUEUE_PAIR::Modify. */
typedef struct fake_qp {
    uint32_t qpn; /* host order */
    int srq;
    uint32_t modified; /* IB_QPS_* bits */
    ib_qp_mod_t init;
    ib_qp_mod_t rtr;
    ib_qp_mod_t rts;
    int32_t errored;
} fake_qp;

void qp_modify(fake_qp *qp, const ib_qp_mod_t *attr);

/* One event a callback saw (the test's instrumentation). */
typedef struct seen {
    int32_t type;
    uint32_t qpn;
    uint32_t starting_psn;
    uint16_t rej_reason;
    uint8_t at_dispatch;
    uint8_t pdata_len;
    uint8_t pdata0;
    uint8_t pdata_last;
    uint8_t resp_res;
    uint8_t init_depth;
    uint8_t flow_ctrl;
    uint8_t rnr_retry_cnt;
    uint8_t target_ack_delay;
    uint8_t failover_accepted;
    uint8_t service_timeout;
    uint8_t reserved[3];
} seen;

typedef struct observer {
    int32_t n;
    seen log[32];
} observer;

void observe(observer *o, const replay_host *h, const iba_cm_event *ev);

#endif
