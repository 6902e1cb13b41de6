/* The replays' shared pieces (replay.h). */
#include <pthread.h>
#include <string.h>

#include "replay.h"

static uintptr_t me(void) { return (uintptr_t)pthread_self(); }

int spin_acquire(spin *l) {
    if (l->owner == me()) {
        l->recursions++;
        return 0;
    }
    while (__atomic_exchange_n(&l->held, 1, __ATOMIC_ACQUIRE)) {
    }
    l->owner = me();
    return 1;
}

void spin_release(spin *l, int taken) {
    if (!taken) {
        return;
    }
    l->owner = 0;
    __atomic_store_n(&l->held, 0, __ATOMIC_RELEASE);
}

typedef struct section {
    spin *lock;
    void (*fn)(void *arg);
    void *arg;
} section;

static void run_locked(void *p) {
    section *s = p;
    int taken = spin_acquire(s->lock);
    s->fn(s->arg);
    spin_release(s->lock, taken);
}

void locked(const replay_host *h, spin *l, void (*fn)(void *arg), void *arg) {
    section s = {l, fn, arg};
    h->at_dispatch(h->ctx, run_locked, &s);
}

void qp_modify(fake_qp *qp, const ib_qp_mod_t *attr) {
    switch (attr->req_state) {
    case IB_QPS_INIT:
        qp->init = *attr;
        break;
    case IB_QPS_RTR:
        qp->rtr = *attr;
        break;
    case IB_QPS_RTS:
        qp->rts = *attr;
        break;
    default:
        qp->errored++;
        return;
    }
    qp->modified |= attr->req_state;
}

static void pdata(seen *s, const void *p, uint8_t len) {
    s->pdata_len = len;
    if (p && len) {
        s->pdata0 = ((const uint8_t *)p)[0];
        s->pdata_last = ((const uint8_t *)p)[len - 1];
    }
}

void observe(observer *o, const replay_host *h, const iba_cm_event *ev) {
    seen s;
    memset(&s, 0, sizeof s);
    s.type = ev->type;
    s.at_dispatch = (uint8_t)h->is_dispatch(h->ctx);
    switch (ev->type) {
    case iba_cm_rep_received:
        s.qpn = rp_h32(ev->data.rep.rep.qpn);
        s.starting_psn = rp_h32(ev->data.rep.rep.starting_psn);
        s.resp_res = ev->data.rep.rep.resp_res;
        s.init_depth = ev->data.rep.rep.init_depth;
        s.flow_ctrl = ev->data.rep.rep.flow_ctrl;
        s.rnr_retry_cnt = ev->data.rep.rep.rnr_retry_cnt;
        s.failover_accepted = ev->data.rep.rep.failover_accepted;
        s.target_ack_delay = ev->data.rep.target_ack_delay;
        pdata(&s, ev->data.rep.rep.p_pdata, ev->data.rep.rep.pdata_len);
        break;
    case iba_cm_rtu_received:
    case iba_cm_dreq_received:
    case iba_cm_drep_received:
        pdata(&s, ev->data.rtu.p_pdata, ev->data.rtu.pdata_len);
        break;
    case iba_cm_rej_received:
        s.rej_reason = rp_h16(ev->data.rej.reason);
        pdata(&s, ev->data.rej.p_pdata, ev->data.rej.pdata_len);
        break;
    case iba_cm_mra_received:
        s.service_timeout = ev->data.mra.service_timeout;
        pdata(&s, ev->data.mra.p_pdata, ev->data.mra.pdata_len);
        break;
    default:
        break;
    }
    if (o->n < 32) {
        o->log[o->n++] = s;
    }
}

/* A call a test makes on an id pointer it kept (the pointer may be stale). */
void raw_destroy_id(const INFINIBAND_INTERFACE_CM *ifc, iba_cm_id *id) { ifc->CM.destroy_id(id); }

NTSTATUS raw_send_mra(const INFINIBAND_INTERFACE_CM *ifc, iba_cm_id *id, uint8_t timeout,
                      const void *p, uint8_t len) {
    return ifc->CM.send_mra(id, timeout, p, len);
}

NTSTATUS raw_send_dreq(const INFINIBAND_INTERFACE_CM *ifc, iba_cm_id *id) {
    return ifc->CM.send_dreq(id, NULL, 0);
}
