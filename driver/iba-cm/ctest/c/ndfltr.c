/*
 * ndfltr's endpoint (core/ndfltr/kernel/nd_ep.cpp, ND_ENDPOINT) as it drives iba_cm, call
 * for call: the same calls with the same arguments, in the same order, under the same
 * queue lock (its queue is created with WdfExecutionLevelDispatch, nd_ep.cpp:127: a spin
 * lock). What ndfltr does around them (IOCTL buffers, WDF queues, IBAT path queries, the
 * flush work item) is reduced to what decides those calls: the endpoint state, the QP
 * binding, the requests its queue holds and how they complete. Each function names the
 * lines it replays.
 */
#include <stdlib.h>
#include <string.h>

#include "replay.h"

/* ND_ENDPOINT::STATE (nd_ep.h:70-110). */
typedef enum nd_state {
    NdEpIdle,
    NdEpAddressBound,
    NdEpListening,
    NdEpQueued,
    NdEpReqReceived,
    NdEpRepSent,
    NdEpResolving,
    NdEpReqSent,
    NdEpRepReceived,
    NdEpConnected,
    NdEpActiveDisconnect,
    NdEpPassiveDisconnect,
    NdEpDisconnected,
    NdEpDestroying
} nd_state;

/* ND_ENDPOINT::TYPE (nd_ep.h:60-64). */
enum { NdEpConnector, NdEpConnectorV1, NdEpListener };

/* nd_ep.cpp:33-34. */
#define CM_LOCAL_TIMEOUT 1
#define CM_REMOTE_TIMEOUT 2

/* What NDFLTR_CONNECT / NDFLTR_ACCEPT carry to the CM. */
typedef struct nd_conn_param {
    uint8_t data[IB_REQ_CM_RDMA_PDATA_SIZE];
    uint8_t data_length;
    uint8_t inbound;  /* ReadLimits.Inbound */
    uint8_t outbound; /* ReadLimits.Outbound */
    uint8_t retry_count;
    uint8_t rnr_retry_count;
    uint8_t rnr_nak_timeout;
} nd_conn_param;

typedef struct nd_ep nd_ep;

struct nd_ep {
    const INFINIBAND_INTERFACE_CM *ifc; /* m_pIfc */
    const replay_host *host;
    spin queue_lock; /* WdfObjectAcquireLock(m_Queue) */
    int type;
    nd_state state;
    iba_cm_id *id; /* m_hIfc */
    fake_qp *qp;   /* m_pQp */
    uint32_t starting_psn; /* m_StartingPsn (RtlRandomEx, nd_ep.cpp:66) */
    uint32_t local_ip, peer_ip;
    uint16_t local_port, peer_port;
    ib_path_rec_t route;
    uint8_t max_inbound, max_outbound; /* the adapter's MaxInbound/OutboundReadLimit */
    uint8_t read_inbound, read_outbound; /* m_ReadLimits */
    uint8_t private_data[IB_REJ_PDATA_SIZE];
    uint8_t private_data_length;
    /* The endpoint's WDF queue: requests held (a listener's carry the endpoint they
     * are for), and how the last one completed. */
    int32_t pending;
    nd_ep *waiting[8];
    int32_t completions;
    NTSTATUS last_status;
    int32_t flushes;
    /* The test's record. */
    observer seen;
    int32_t destroy_calls;
};

nd_ep *nd_ep_new(const INFINIBAND_INTERFACE_CM *ifc, const replay_host *host, int32_t type,
                 uint32_t psn) {
    nd_ep *ep = calloc(1, sizeof *ep);
    if (ep) {
        ep->ifc = ifc;
        ep->host = host;
        ep->type = type;
        ep->starting_psn = psn;
        ep->max_inbound = 16;
        ep->max_outbound = 16;
    }
    return ep;
}

void nd_ep_release_memory(nd_ep *ep) { free(ep); }

/* NdCompleteRequests: every request held completes with `status`. */
static void complete_requests(nd_ep *ep, NTSTATUS status) {
    while (ep->pending > 0) {
        ep->pending--;
        ep->completions++;
        ep->last_status = status;
    }
}

static void complete(nd_ep *ep, NTSTATUS status) {
    ep->completions++;
    ep->last_status = status;
}

/* AsyncFlushQp (nd_ep.cpp:831-854): the first request completes with `status` from the
 * work item, after the QP is unbound (FlushQpWorker, 810-828). */
static void async_flush_qp(nd_ep *ep, NTSTATUS status) {
    if (ep->pending > 0) {
        ep->pending--;
        complete(ep, status);
    }
    if (ep->qp) {
        ep->qp->errored++;
        ep->qp = NULL;
    }
    ep->flushes++;
}

/* ND_ENDPOINT::GetServiceId (nd_ep.cpp:641-644): ib_cm_rdma_sid(IPPROTO_TCP, port). */
static net64_t service_id(uint16_t port_net) {
    return 0x0000000100000000ull | (uint64_t)6 << 40 | (uint64_t)port_net << 48;
}

/* FormatRdmaCmHeader (nd_ep.cpp:647-668), IPv4. */
static void format_rdma_cm_header(rdma_cm_hdr *h, uint32_t local_ip, uint16_t local_port,
                                  uint32_t peer_ip) {
    memset(h, 0, sizeof *h);
    h->version = IB_REQ_CM_RDMA_VERSION;
    h->ip_version = 4 << 4;
    h->src[3] = local_ip;
    h->dst[3] = peer_ip;
    h->port = local_port;
}

/* ---- the callbacks -------------------------------------------------------------------- */

/* ProcessCmRep (nd_ep.cpp:671-692). */
static void process_cm_rep(nd_ep *ep, const iba_cm_rep_event *rep) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpReqSent) {
        ep->private_data_length = IB_REJ_PDATA_SIZE;
        memcpy(ep->private_data, rep->rep.p_pdata, IB_REJ_PDATA_SIZE);
        ep->read_inbound = rep->rep.init_depth;
        ep->read_outbound = rep->rep.resp_res;
        ep->state = NdEpRepReceived;
        complete_requests(ep, STATUS_SUCCESS);
    }
    spin_release(&ep->queue_lock, taken);
}

/* ProcessCmRtu (nd_ep.cpp:695-711). */
static void process_cm_rtu(nd_ep *ep) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpRepSent) {
        ep->state = NdEpConnected;
        complete_requests(ep, STATUS_SUCCESS);
    }
    spin_release(&ep->queue_lock, taken);
}

/* ProcessCmDreq (nd_ep.cpp:714-743): in NdEpActiveDisconnect (the DREQs crossed) the DREP
 * goes from inside the callback, under the queue lock (739). */
static void process_cm_dreq(nd_ep *ep) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpConnected) {
        ep->state = NdEpPassiveDisconnect;
        complete_requests(ep, STATUS_SUCCESS);
        async_flush_qp(ep, STATUS_SUCCESS);
    } else if (ep->state == NdEpRepSent) {
        ep->state = NdEpPassiveDisconnect;
        complete_requests(ep, STATUS_SUCCESS);
    } else if (ep->state == NdEpActiveDisconnect) {
        ep->state = NdEpDisconnected;
        ep->ifc->CM.send_drep(ep->id, NULL, 0);
        async_flush_qp(ep, STATUS_SUCCESS);
    }
    spin_release(&ep->queue_lock, taken);
}

/* CompleteDisconnect (nd_ep.cpp:746-754). */
static void complete_disconnect(nd_ep *ep, NTSTATUS status) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpActiveDisconnect) {
        ep->state = NdEpDisconnected;
        async_flush_qp(ep, status);
    }
    spin_release(&ep->queue_lock, taken);
}

/* ProcessCmRej (nd_ep.cpp:757-775): a rejected connector is bound again, its id kept for
 * the next Connect (nd_ep.h:92-93). */
static void process_cm_rej(nd_ep *ep, const iba_cm_rej_event *rej) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpReqSent) {
        ep->state = NdEpAddressBound;
        ep->private_data_length = IB_REJ_PDATA_SIZE;
        memcpy(ep->private_data, rej->p_pdata, IB_REJ_PDATA_SIZE);
        complete_requests(ep, STATUS_CONNECTION_REFUSED);
    } else if (ep->state == NdEpRepSent) {
        ep->state = NdEpDisconnected;
        ep->private_data_length = IB_REJ_PDATA_SIZE;
        memcpy(ep->private_data, rej->p_pdata, IB_REJ_PDATA_SIZE);
        async_flush_qp(ep, STATUS_CONNECTION_REFUSED);
    } else if (ep->state == NdEpConnected) {
        ep->state = NdEpPassiveDisconnect;
        complete_requests(ep, STATUS_SUCCESS);
    }
    spin_release(&ep->queue_lock, taken);
}

/* CmReqError (nd_ep.cpp:778-794). */
static void cm_req_error(nd_ep *ep) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpReqSent) {
        ep->qp = NULL; /* UnbindQp(false, ..) */
        ep->state = NdEpAddressBound;
        complete_requests(ep, ep->type == NdEpConnectorV1 ? STATUS_TIMEOUT : STATUS_IO_TIMEOUT);
    }
    spin_release(&ep->queue_lock, taken);
}

/* CmRepError (nd_ep.cpp:797-807). */
static void cm_rep_error(nd_ep *ep) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state == NdEpRepSent) {
        ep->state = NdEpDisconnected;
        async_flush_qp(ep, STATUS_IO_TIMEOUT);
    }
    spin_release(&ep->queue_lock, taken);
}

/* ND_ENDPOINT::CmHandler (nd_ep.cpp:857-907). */
static NTSTATUS cm_handler(iba_cm_id *id, iba_cm_event *ev) {
    nd_ep *ep = id->context;
    observe(&ep->seen, ep->host, ev);
    switch (ev->type) {
    case iba_cm_req_error:
        cm_req_error(ep);
        break;
    case iba_cm_rep_error:
        cm_rep_error(ep);
        break;
    case iba_cm_dreq_error:
        complete_disconnect(ep, STATUS_TIMEOUT);
        break;
    case iba_cm_rep_received:
        process_cm_rep(ep, &ev->data.rep);
        break;
    case iba_cm_rtu_received:
        process_cm_rtu(ep);
        break;
    case iba_cm_dreq_received:
        process_cm_dreq(ep);
        break;
    case iba_cm_drep_received:
        complete_disconnect(ep, STATUS_SUCCESS);
        break;
    case iba_cm_rej_received:
        process_cm_rej(ep, &ev->data.rej);
        break;
    default:
        break;
    }
    return STATUS_SUCCESS;
}

/* ProcessCmReq (nd_ep.cpp:1973-2030), under the listener's and the endpoint's locks. */
static NTSTATUS process_cm_req(nd_ep *listener, nd_ep *ep) {
    iba_cm_event event;
    NTSTATUS status = listener->ifc->CM.get_request_ex(listener->id, cm_handler, ep, &ep->id,
                                                       &event); /* 1978 */
    if (!NT_SUCCESS(status)) {
        return status;
    }
    ep->local_ip = listener->local_ip;
    ep->local_port = listener->local_port;
    const rdma_cm_hdr *hdr = (const rdma_cm_hdr *)event.data.req.pdata;
    ep->peer_port = hdr->port;
    ep->peer_ip = hdr->src[3];
    ep->read_inbound = event.data.req.init_depth;
    ep->read_outbound = event.data.req.resp_res;
    ep->private_data_length = IB_REQ_CM_RDMA_PDATA_SIZE;
    memcpy(ep->private_data, hdr + 1, IB_REQ_CM_RDMA_PDATA_SIZE);
    ep->route = event.data.req.primary_path;
    ep->state = NdEpReqReceived;
    return STATUS_SUCCESS;
}

/* ND_ENDPOINT::ListenHandler (nd_ep.cpp:2033-2062). */
static NTSTATUS listen_handler(iba_cm_id *id, iba_cm_event *ev) {
    nd_ep *listener = id->context;
    (void)ev;
    int taken = spin_acquire(&listener->queue_lock);
    if (listener->state != NdEpListening) {
        spin_release(&listener->queue_lock, taken);
        return STATUS_INVALID_DEVICE_STATE;
    }
    while (listener->pending > 0) {
        nd_ep *ep = listener->waiting[0];
        NTSTATUS status = process_cm_req(listener, ep);
        if (!NT_SUCCESS(status)) {
            break; /* WdfRequestRequeue */
        }
        listener->pending--;
        memmove(listener->waiting, listener->waiting + 1, sizeof listener->waiting[0] * 7);
        complete(listener, STATUS_SUCCESS);
    }
    spin_release(&listener->queue_lock, taken);
    return STATUS_SUCCESS;
}

/* ---- the IOCTLs (PASSIVE_LEVEL) ---------------------------------------------------------- */

typedef struct call {
    nd_ep *ep;
    nd_ep *other;
    const nd_conn_param *param;
    NTSTATUS status;
    int flag;
    fake_qp *qp;
} call;

/* nd_ep.cpp:387-418, under the queue lock. */
static void bind_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    if (ep->state != NdEpIdle) {
        c->status = STATUS_CONNECTION_ACTIVE; /* STATUS_ADDRESS_ALREADY_ASSOCIATED */
        return;
    }
    if (ep->type == NdEpListener) {
        c->status = ep->ifc->CM.create_id(listen_handler, ep, &ep->id); /* 399 */
    } else {
        c->status = ep->ifc->CM.create_id(cm_handler, ep, &ep->id); /* 401 */
    }
    if (NT_SUCCESS(c->status)) {
        if (ep->local_port == 0) { /* 411-414 */
            ep->local_port = (uint16_t)(rp_h32(ep->id->cid) ^ (rp_h32(ep->id->cid) >> 16));
        }
        ep->state = NdEpAddressBound;
    }
}

/* ND_ENDPOINT::Bind (nd_ep.cpp:375-420). */
NTSTATUS nd_ep_bind(nd_ep *ep, uint32_t ip, uint16_t port) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    ep->local_ip = ip;
    ep->local_port = port;
    locked(ep->host, &ep->queue_lock, bind_locked, &c);
    return c.status;
}

/* nd_ep.cpp:577-622, under the queue lock. */
static void connect_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    switch (ep->state) {
    case NdEpAddressBound:
        if (ep->type == NdEpListener) {
            c->status = STATUS_INVALID_DEVICE_STATE;
        } else {
            /* BindQp (nd_ep.cpp:170-188): a QP bound before (kept after a REJ, 757-765)
             * is only NT_ASSERTed against; the new one is bound. */
            ep->qp = c->qp;
        }
        break;
    case NdEpIdle:
        c->status = STATUS_INVALID_DEVICE_STATE; /* STATUS_ADDRESS_NOT_ASSOCIATED */
        break;
    case NdEpQueued:
    case NdEpDisconnected:
    case NdEpDestroying:
        c->status = STATUS_INVALID_DEVICE_STATE;
        break;
    default:
        c->status = STATUS_CONNECTION_ACTIVE;
        break;
    }
    if (!NT_SUCCESS(c->status)) {
        return;
    }
    ep->pending++; /* WdfRequestForwardToIoQueue */
    ep->state = NdEpResolving;
}

/* SendIbCmReq (nd_ep.cpp:910-969). */
static NTSTATUS send_ib_cm_req(nd_ep *ep, const nd_conn_param *param) {
    rdma_cm_hdr *hdr;
    uint8_t data[sizeof(rdma_cm_hdr) + IB_REQ_CM_RDMA_PDATA_SIZE];
    iba_cm_req req;
    memset(&req, 0, sizeof req);
    hdr = (rdma_cm_hdr *)data;
    format_rdma_cm_header(hdr, ep->local_ip, ep->local_port, ep->peer_ip);
    req.service_id = service_id(ep->peer_port);
    req.p_primary_path = &ep->route;
    req.p_alt_path = NULL;
    req.qpn = rp_h32(ep->qp->qpn);
    req.qp_type = IB_QPT_RELIABLE_CONN;
    req.starting_psn = ep->starting_psn;
    req.p_pdata = data;
    memcpy(data + sizeof(rdma_cm_hdr), param->data, param->data_length);
    req.pdata_len = (uint8_t)(sizeof(rdma_cm_hdr) + param->data_length);
    req.max_cm_retries = IB_CMA_MAX_CM_RETRIES;
    req.resp_res = param->inbound > ep->max_inbound ? ep->max_inbound : param->inbound;
    req.init_depth = param->outbound > ep->max_outbound ? ep->max_outbound : param->outbound;
    req.remote_resp_timeout = (uint8_t)((ep->route.pkt_life & 0x3F) + CM_REMOTE_TIMEOUT);
    if (req.remote_resp_timeout > 0x1F) {
        req.remote_resp_timeout = 0x1F;
    } else if (req.remote_resp_timeout < IB_CMA_CM_RESPONSE_TIMEOUT) {
        req.remote_resp_timeout = IB_CMA_CM_RESPONSE_TIMEOUT;
    }
    req.flow_ctrl = 1;
    req.local_resp_timeout = (uint8_t)((ep->route.pkt_life & 0x3F) + CM_LOCAL_TIMEOUT);
    if (req.local_resp_timeout > 0x1F) {
        req.local_resp_timeout = 0x1F;
    } else if (req.local_resp_timeout < IB_CMA_CM_RESPONSE_TIMEOUT) {
        req.local_resp_timeout = IB_CMA_CM_RESPONSE_TIMEOUT;
    }
    req.rnr_retry_cnt = param->rnr_retry_count;
    req.retry_cnt = param->retry_count;
    req.srq = (uint8_t)(ep->qp->srq != 0);
    return ep->ifc->CM.send_req(ep->id, &req); /* 964 */
}

/* SendConnectionRequest (nd_ep.cpp:506-565), the part under the queue lock. */
static void send_connection_request_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    if (ep->state != NdEpResolving) {
        c->status = STATUS_UNSUCCESSFUL; /* STATUS_CANCELLED */
    } else {
        c->status = send_ib_cm_req(ep, c->param);
        if (NT_SUCCESS(c->status)) {
            ep->state = NdEpReqSent; /* 553; the request is requeued */
            return;
        }
        ep->state = NdEpAddressBound;
    }
    ep->qp = NULL; /* UnbindQp(false, ..) */
    ep->pending--;
    complete(ep, c->status);
}

/* NdEpConnect + ND_ENDPOINT::Connect (nd_ep.cpp:973-1032, 568-638); the IBAT path query
 * answers at once with `route` (QueryPathHandler, 489-502, then SendConnectionRequest). */
NTSTATUS nd_ep_connect(nd_ep *ep, fake_qp *qp, uint32_t peer_ip, uint16_t peer_port,
                       const ib_path_rec_t *route, const nd_conn_param *param) {
    call c = {ep, NULL, param, STATUS_SUCCESS, 0, qp};
    if (param->data_length > IB_REQ_CM_RDMA_PDATA_SIZE) {
        return STATUS_INVALID_PARAMETER;
    }
    locked(ep->host, &ep->queue_lock, connect_locked, &c);
    if (!NT_SUCCESS(c.status)) {
        return c.status;
    }
    ep->peer_ip = peer_ip;
    ep->peer_port = peer_port;
    ep->route = *route;
    locked(ep->host, &ep->queue_lock, send_connection_request_locked, &c);
    return STATUS_PENDING;
}

/* ModifyQp (nd_ep.cpp:1035-1052). */
static NTSTATUS modify_qp(nd_ep *ep, uint32_t state, uint8_t rnr_nak_timeout) {
    ib_qp_mod_t attr;
    NTSTATUS status = ep->ifc->CM.get_qp_attr(ep->id, state, &attr); /* 1038 */
    if (!NT_SUCCESS(status)) {
        return status;
    }
    if (state == IB_QPS_RTR) {
        attr.state.rtr.resp_res = ep->read_inbound;
        attr.state.rtr.rnr_nak_timeout = rnr_nak_timeout;
    } else if (state == IB_QPS_RTS) {
        attr.state.rts.init_depth = ep->read_outbound;
    }
    qp_modify(ep->qp, &attr);
    return STATUS_SUCCESS;
}

static void complete_connect_check(void *p) {
    call *c = p;
    switch (c->ep->state) {
    case NdEpRepReceived:
        break;
    case NdEpDisconnected:
        c->status = STATUS_CONNECTION_ABORTED;
        break;
    default:
        c->status = STATUS_CONNECTION_INVALID;
        break;
    }
}

/* nd_ep.cpp:1146-1160, under the queue lock. */
static void complete_connect_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    if (ep->state != NdEpRepReceived) {
        ep->state = NdEpDisconnected;
        c->status = STATUS_IO_TIMEOUT;
        return;
    }
    c->status = ep->ifc->CM.send_rtu(ep->id, NULL, 0); /* 1153 */
    ep->state = NT_SUCCESS(c->status) ? NdEpConnected : NdEpDisconnected;
}

/* NdEpCompleteConnect + ND_ENDPOINT::CompleteConnect (nd_ep.cpp:1056-1110, 1113-1162): INIT, RTR,
 * RTS, then the RTU. */
NTSTATUS nd_ep_complete_connect(nd_ep *ep, uint8_t rnr_nak_timeout) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, complete_connect_check, &c);
    if (!NT_SUCCESS(c.status)) {
        return c.status;
    }
    NTSTATUS status = modify_qp(ep, IB_QPS_INIT, 0);
    if (NT_SUCCESS(status)) {
        status = modify_qp(ep, IB_QPS_RTR, rnr_nak_timeout);
    }
    if (NT_SUCCESS(status)) {
        status = modify_qp(ep, IB_QPS_RTS, 0);
    }
    if (!NT_SUCCESS(status)) {
        return status;
    }
    locked(ep->host, &ep->queue_lock, complete_connect_locked, &c);
    return c.status;
}

/* GetConnectionRequest (nd_ep.cpp:2185-2219), under the listener's lock then the
 * endpoint's. */
static void get_connection_request_locked(void *p) {
    call *c = p;
    nd_ep *listener = c->ep;
    nd_ep *ep = c->other;
    if (listener->state != NdEpListening) {
        c->status = STATUS_INVALID_DEVICE_STATE;
        return;
    }
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state != NdEpIdle) {
        c->status = STATUS_CONNECTION_ACTIVE;
    } else {
        c->status = process_cm_req(listener, ep);
        if (!NT_SUCCESS(c->status)) {
            if (listener->pending >= 8) {
                c->status = STATUS_INVALID_PARAMETER;
            } else {
                ep->state = NdEpQueued;
                listener->waiting[listener->pending++] = ep;
                c->status = STATUS_PENDING;
            }
        }
    }
    spin_release(&ep->queue_lock, taken);
}

/* NdEpGetConnectionRequest (nd_ep.cpp:2139-2182). */
NTSTATUS nd_ep_get_connection_request(nd_ep *listener, nd_ep *ep) {
    call c = {listener, ep, NULL, STATUS_SUCCESS, 0, NULL};
    locked(listener->host, &listener->queue_lock, get_connection_request_locked, &c);
    return c.status;
}

/* FormatIbCmRep (nd_ep.cpp:1165-1206). */
static NTSTATUS format_ib_cm_rep(nd_ep *ep, const nd_conn_param *param, ib_qp_mod_t *qp_mod) {
    iba_cm_rep rep;
    memset(&rep, 0, sizeof rep);
    rep.qpn = rp_h32(ep->qp->qpn);
    rep.starting_psn = ep->starting_psn;
    rep.p_pdata = param->data;
    rep.pdata_len = param->data_length;
    rep.failover_accepted = IB_FAILOVER_ACCEPT_UNSUPPORTED;
    rep.resp_res = param->inbound > ep->read_inbound ? ep->read_inbound : param->inbound;
    if (param->outbound > ep->read_outbound) {
        if (ep->read_outbound == 0) {
            return STATUS_INVALID_PARAMETER;
        }
        rep.init_depth = ep->read_outbound;
    } else {
        rep.init_depth = param->outbound;
    }
    rep.flow_ctrl = 1;
    rep.rnr_retry_cnt = param->rnr_retry_count;
    rep.srq = (uint8_t)(ep->qp->srq != 0);
    return ep->ifc->CM.format_rep(ep->id, &rep, qp_mod); /* 1201 */
}

/* nd_ep.cpp:1295-1316, under the queue lock. */
static void accept_bind_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    switch (ep->state) {
    case NdEpReqReceived:
        break;
    case NdEpDisconnected:
        c->status = STATUS_CONNECTION_ABORTED;
        return;
    default:
        c->status = STATUS_CONNECTION_ACTIVE;
        return;
    }
    ep->qp = c->qp; /* BindQp */
    ep->state = NdEpRepSent;
}

/* nd_ep.cpp:1345-1366, under the queue lock. */
static void send_formatted_rep_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    c->status = ep->ifc->CM.send_formatted_rep(ep->id); /* 1346 */
    if (NT_SUCCESS(c->status)) {
        ep->pending++; /* WdfRequestForwardToIoQueue */
        c->status = STATUS_PENDING;
    } else {
        ep->state = NdEpDisconnected;
    }
}

static void disconnected_locked(void *p) { ((call *)p)->ep->state = NdEpDisconnected; }

/* NdEpAccept + ND_ENDPOINT::Accept (nd_ep.cpp:1210-1282, 1285-1367): format_rep, the QP to INIT
 * with its attributes, RTR and RTS, then send_formatted_rep. */
NTSTATUS nd_ep_accept(nd_ep *ep, fake_qp *qp, const nd_conn_param *param) {
    call c = {ep, NULL, param, STATUS_SUCCESS, 0, qp};
    ib_qp_mod_t qp_mod;
    NTSTATUS status;
    if (param->data_length > IB_REJ_PDATA_SIZE) {
        return STATUS_INVALID_PARAMETER;
    }
    locked(ep->host, &ep->queue_lock, accept_bind_locked, &c);
    if (!NT_SUCCESS(c.status)) {
        return c.status;
    }
    status = format_ib_cm_rep(ep, param, &qp_mod); /* 1319 */
    if (NT_SUCCESS(status)) {
        qp_modify(ep->qp, &qp_mod); /* 1325 */
        status = modify_qp(ep, IB_QPS_RTR, param->rnr_nak_timeout); /* 1331 */
        if (!NT_SUCCESS(status)) {
            ep->qp = NULL;
        } else {
            status = modify_qp(ep, IB_QPS_RTS, 0); /* 1340 */
        }
    } else {
        ep->qp = NULL;
    }
    if (!NT_SUCCESS(status)) {
        locked(ep->host, &ep->queue_lock, disconnected_locked, &c);
        return status;
    }
    locked(ep->host, &ep->queue_lock, send_formatted_rep_locked, &c);
    return c.status;
}

/* nd_ep.cpp:1424-1452, under the queue lock. */
static void reject_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    switch (ep->state) {
    case NdEpReqReceived:
    case NdEpRepReceived:
        c->status = ep->ifc->CM.send_rej(ep->id, rp_h16(IBCM_REJ_USER_DEFINED), NULL, 0,
                                         c->param->data, c->param->data_length); /* 1428 */
        if (c->status == STATUS_SUCCESS) {
            ep->state = NdEpDisconnected;
            break;
        }
        c->status = STATUS_CONNECTION_INVALID;
        break;
    case NdEpDisconnected:
        c->status = STATUS_CONNECTION_INVALID;
        break;
    default:
        c->status = STATUS_INVALID_DEVICE_STATE;
    }
}

/* NdEpReject + ND_ENDPOINT::Reject (nd_ep.cpp:1371-1418, 1421-1454). */
NTSTATUS nd_ep_reject(nd_ep *ep, const nd_conn_param *param) {
    call c = {ep, NULL, param, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, reject_locked, &c);
    return c.status;
}

/* nd_ep.cpp:1851-1891, the part under the queue lock. */
static void disconnect_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    switch (ep->state) {
    case NdEpConnected:
        complete_requests(ep, STATUS_CONNECTION_DISCONNECTED);
        c->status = ep->ifc->CM.send_dreq(ep->id, NULL, 0); /* 1863 */
        if (NT_SUCCESS(c->status)) {
            ep->pending++;
            ep->state = NdEpActiveDisconnect;
            c->status = STATUS_PENDING;
            break;
        }
        __attribute__((fallthrough)); /* nd_ep.cpp:1872 */
    case NdEpPassiveDisconnect:
        ep->state = NdEpDisconnected;
        c->flag = 1;
        break;
    case NdEpActiveDisconnect:
        c->status = STATUS_INVALID_DEVICE_STATE;
        break;
    default:
        c->status = STATUS_CONNECTION_INVALID;
        break;
    }
}

/* NdEpDisconnect + ND_ENDPOINT::Disconnect (nd_ep.cpp:1787-1845, 1848-1894): the DREQ under the lock,
 * or the DREP at PASSIVE_LEVEL after it is released (1879). */
NTSTATUS nd_ep_disconnect(nd_ep *ep) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, disconnect_locked, &c);
    if (c.flag) {
        ep->ifc->CM.send_drep(ep->id, NULL, 0);
        if (ep->qp) { /* UnbindQp(true, ..) */
            ep->qp->errored++;
            ep->qp = NULL;
        }
        return STATUS_SUCCESS;
    }
    return c.status;
}

/* nd_ep.cpp:2105-2133, under the queue lock. */
static void listen_locked(void *p) {
    call *c = p;
    nd_ep *ep = c->ep;
    rdma_cm_hdr pdata;
    if (ep->state != NdEpAddressBound) {
        c->status = STATUS_INVALID_DEVICE_STATE;
        return;
    }
    format_rdma_cm_header(&pdata, ep->local_ip, ep->local_port, ep->local_ip);
    c->status = ep->ifc->CM.listen(ep->id, service_id(ep->local_port), &pdata,
                                   (uint8_t)sizeof pdata, /* FIELD_OFFSET(.., pdata) */
                                   IB_REQ_CM_RDMA_CMP_DST_IP); /* 2121 */
    if (NT_SUCCESS(c->status)) {
        ep->state = NdEpListening;
    }
}

/* NdEpListen + ND_ENDPOINT::Listen (nd_ep.cpp:2066-2099, 2102-2135). */
NTSTATUS nd_ep_listen(nd_ep *ep) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, listen_locked, &c);
    return c.status;
}

static void destroying_locked(void *p) { ((call *)p)->ep->state = NdEpDestroying; }

/* ND_ENDPOINT::RemoveHandler (nd_ep.cpp:149-167), from the adapter's D0Exit at HCA
 * removal: destroy_id, and m_hIfc is not cleared. */
void nd_ep_remove_handler(nd_ep *ep) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, destroying_locked, &c);
    if (ep->id != NULL) {
        ep->ifc->CM.destroy_id(ep->id); /* 156 */
        ep->destroy_calls++;
    }
    complete_requests(ep, STATUS_DEVICE_REMOVED);
}

/* ND_ENDPOINT::~ND_ENDPOINT (nd_ep.cpp:76-110), when the process closes the handle: the
 * same m_hIfc destroyed again (101-102). */
void nd_ep_destructor(nd_ep *ep) {
    call c = {ep, NULL, NULL, STATUS_SUCCESS, 0, NULL};
    locked(ep->host, &ep->queue_lock, destroying_locked, &c);
    if (ep->qp) {
        ep->qp = NULL;
    }
    if (ep->id != NULL) {
        ep->ifc->CM.destroy_id(ep->id); /* 102 */
        ep->destroy_calls++;
    }
}

/* ---- what the test reads ---------------------------------------------------------------- */

int32_t nd_ep_state(const nd_ep *ep) { return (int32_t)ep->state; }
iba_cm_id *nd_ep_id(const nd_ep *ep) { return ep->id; }
int32_t nd_ep_pending(const nd_ep *ep) { return ep->pending; }
int32_t nd_ep_completions(const nd_ep *ep) { return ep->completions; }
NTSTATUS nd_ep_last_status(const nd_ep *ep) { return ep->last_status; }
int32_t nd_ep_recursions(const nd_ep *ep) { return ep->queue_lock.recursions; }
int32_t nd_ep_flushes(const nd_ep *ep) { return ep->flushes; }
uint16_t nd_ep_local_port(const nd_ep *ep) { return ep->local_port; }
void nd_ep_read_limits(const nd_ep *ep, uint8_t *inbound, uint8_t *outbound) {
    *inbound = ep->read_inbound;
    *outbound = ep->read_outbound;
}
int nd_ep_seen(const nd_ep *ep, int32_t i, seen *out) {
    if (i < 0 || i >= ep->seen.n) {
        return 0;
    }
    *out = ep->seen.log[i];
    return 1;
}
