/*
 * WinVerbs' endpoint (core/winverbs/kernel/wv_ep.c) as it drives iba_cm, call for call:
 * the same calls with the same arguments, in the same order, under the same queue lock.
 * What WinVerbs does around them (IOCTL buffers, WDF request queues, the work queue) is
 * reduced to what decides those calls: the endpoint state, the requests a queue holds and
 * the status they complete with. Each function names the lines it replays.
 */
#include <stdlib.h>
#include <string.h>

#include "replay.h"

/* WV_ENDPOINT_STATE (wv_ep.h), in its order. */
typedef enum wv_state {
    WvEpIdle,
    WvEpAddressBound,
    WvEpListening,
    WvEpQueued,
    WvEpRouteResolved,
    WvEpPassiveConnect,
    WvEpActiveConnect,
    WvEpConnected,
    WvEpActiveDisconnect,
    WvEpPassiveDisconnect,
    WvEpDisconnected,
    WvEpDestroying
} wv_state;

/* WV_IO_CONNECT_PARAM, the part the CM sees. */
typedef struct wv_connect_param {
    uint8_t data[IB_REQ_CM_RDMA_PDATA_SIZE];
    uint8_t data_length;
    uint8_t responder_resources;
    uint8_t initiator_depth;
    uint8_t retry_count;
    uint8_t rnr_retry_count;
} wv_connect_param;

typedef struct wv_ep wv_ep;

struct wv_ep {
    const INFINIBAND_INTERFACE_CM *ifc; /* IbCmInterface */
    const replay_host *host;
    spin queue_lock; /* WdfObjectAcquireLock(ep->Queue) */
    wv_state state;
    iba_cm_id *id; /* pIbCmId */
    uint16_t ep_type;
    ib_path_rec_t route;
    /* Attributes: addresses (IPv4, net order) and the connect parameters. */
    uint32_t local_ip, peer_ip;
    uint16_t local_port, peer_port;
    wv_connect_param connect;
    uint64_t device_guid;
    uint16_t pkey;
    uint8_t port_number;
    /* The endpoint's WDF queue: requests held, and how the last one completed. */
    int32_t pending;
    int32_t completions;
    NTSTATUS last_status;
    /* A listen's Entry list: endpoints queued by WvEpGetRequest. */
    wv_ep *entry[8];
    int32_t entries;
    /* The test's record. */
    observer seen;
    iba_cm_req_event req; /* the last REQ event get_request gave */
    int32_t ids_created;
};

wv_ep *wv_ep_new(const INFINIBAND_INTERFACE_CM *ifc, const replay_host *host, uint16_t ep_type) {
    wv_ep *ep = calloc(1, sizeof *ep);
    if (ep) {
        ep->ifc = ifc;
        ep->host = host;
        ep->ep_type = ep_type;
    }
    return ep;
}

void wv_ep_release_memory(wv_ep *ep) { free(ep); }

/* WvCompleteRequests: every request the queue holds completes with `status`. */
static void complete_requests(wv_ep *ep, NTSTATUS status) {
    while (ep->pending > 0) {
        ep->pending--;
        ep->completions++;
        ep->last_status = status;
    }
}

/* WdfRequestComplete of the request in hand. */
static void complete(wv_ep *ep, NTSTATUS status) {
    ep->completions++;
    ep->last_status = status;
}

/* WvGetServiceId (wv_ep.c:335-339): (EpType << 16) + port, net order. */
static net64_t service_id(uint16_t ep_type, uint16_t port_net) {
    return rp_h64(((uint64_t)ep_type << 16) + rp_h16(port_net));
}

/* WvAnyAddress (wv_ep.c:341-349), IPv4. */
static int any_address(uint32_t ip) { return ip == 0 || (ip & 0xff) == 0x7f; }

/* WvFormatCmaHeader (wv_ep.c:351-373), IPv4. */
static void format_cma_header(rdma_cm_hdr *h, uint32_t local_ip, uint16_t local_port,
                              uint32_t peer_ip) {
    memset(h, 0, sizeof *h);
    h->version = IB_REQ_CM_RDMA_VERSION;
    h->ip_version = IB_REQ_CM_RDMA_IPV4;
    h->src[3] = local_ip;
    h->dst[3] = peer_ip;
    h->port = local_port;
}

/* ---- the callbacks -------------------------------------------------------------------- */

/* WvEpSaveReply (wv_ep.c:375-385). */
static void save_reply(wv_ep *ep, const iba_cm_rep_event *rep) {
    memcpy(ep->connect.data, rep->rep.p_pdata, sizeof ep->connect.data);
    ep->connect.data_length = sizeof ep->connect.data;
    ep->connect.initiator_depth = rep->rep.resp_res;
    ep->connect.responder_resources = rep->rep.init_depth;
    ep->connect.rnr_retry_count = rep->rep.rnr_retry_cnt;
}

/* WvEpSaveReject (wv_ep.c:387-394). */
static void save_reject(wv_ep *ep, const iba_cm_rej_event *rej) {
    memcpy(ep->connect.data, rej->p_pdata, sizeof ep->connect.data);
    ep->connect.data_length = sizeof ep->connect.data;
}

/* WvEpCompleteDisconnect (wv_ep.c:465-503), the queue part. */
static void complete_disconnect(wv_ep *ep, NTSTATUS status) {
    int taken = spin_acquire(&ep->queue_lock);
    if (ep->state != WvEpDestroying) {
        ep->state = WvEpDisconnected;
        complete_requests(ep, status);
    }
    spin_release(&ep->queue_lock, taken);
}

/* WvEpIbCmHandler (wv_ep.c:505-586). */
static NTSTATUS cm_handler(iba_cm_id *id, iba_cm_event *ev) {
    wv_ep *ep = id->context;
    int taken;
    observe(&ep->seen, ep->host, ev);
    switch (ev->type) {
    case iba_cm_req_error: /* 511-518 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpActiveConnect) {
            ep->state = WvEpRouteResolved;
            complete_requests(ep, STATUS_TIMEOUT);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    case iba_cm_rep_error: /* 519-526 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpPassiveConnect) {
            ep->state = WvEpDisconnected;
            complete_requests(ep, STATUS_IO_TIMEOUT);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    case iba_cm_dreq_error: /* 527-529 */
        complete_disconnect(ep, STATUS_TIMEOUT);
        break;
    case iba_cm_rep_received: /* 530-537 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpActiveConnect) {
            save_reply(ep, &ev->data.rep);
            complete_requests(ep, STATUS_SUCCESS);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    case iba_cm_rtu_received: /* 538-545 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpPassiveConnect) {
            ep->state = WvEpConnected;
            complete_requests(ep, STATUS_SUCCESS);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    case iba_cm_dreq_received: /* 546-560 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpConnected) {
            ep->state = WvEpPassiveDisconnect;
            complete_requests(ep, STATUS_SUCCESS);
            spin_release(&ep->queue_lock, taken);
        } else if (ep->state == WvEpPassiveConnect) {
            ep->state = WvEpPassiveDisconnect;
            complete_requests(ep, STATUS_SUCCESS);
            spin_release(&ep->queue_lock, taken);
        } else {
            spin_release(&ep->queue_lock, taken);
            complete_disconnect(ep, STATUS_SUCCESS);
        }
        break;
    case iba_cm_drep_received: /* 561-563 */
        complete_disconnect(ep, STATUS_SUCCESS);
        break;
    case iba_cm_rej_received: /* 564-572 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state == WvEpPassiveConnect || ep->state == WvEpActiveConnect) {
            ep->state = WvEpDisconnected;
            save_reject(ep, &ev->data.rej);
            complete_requests(ep, STATUS_CONNECTION_REFUSED);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    case iba_cm_mra_received: /* 573-574 */
        break;
    default: /* 575-583 */
        taken = spin_acquire(&ep->queue_lock);
        if (ep->state != WvEpDestroying) {
            ep->state = WvEpDisconnected;
            complete_requests(ep, STATUS_NOT_IMPLEMENTED);
        }
        spin_release(&ep->queue_lock, taken);
        break;
    }
    return STATUS_SUCCESS;
}

/* WvEpGetIbRequest (wv_ep.c:1125-1187): under the listen's lock, one get_request per
 * queued GetRequest; the id's callback and context are rewritten (1149-1151). */
static void get_ib_request(wv_ep *listen) {
    int taken = spin_acquire(&listen->queue_lock);
    while (listen->pending > 0) {
        iba_cm_id *id;
        iba_cm_event event;
        NTSTATUS status = listen->ifc->CM.get_request(listen->id, &id, &event); /* 1141 */
        if (!NT_SUCCESS(status)) {
            break; /* WdfRequestRequeue */
        }
        listen->pending--;
        wv_ep *ep = listen->entry[0];
        memmove(listen->entry, listen->entry + 1, sizeof listen->entry[0] * 7);
        listen->entries--;
        ep->id = id;
        id->callback = cm_handler;
        id->context = ep;
        const rdma_cm_hdr *hdr = (const rdma_cm_hdr *)event.data.req.pdata;
        ep->local_ip = hdr->dst[3];
        ep->peer_ip = hdr->src[3];
        ep->peer_port = hdr->port;
        ep->device_guid = event.data.req.local_ca_guid;
        ep->pkey = event.data.req.primary_path.pkey;
        ep->port_number = event.data.req.port_num;
        ep->connect.responder_resources = event.data.req.resp_res;
        ep->connect.initiator_depth = event.data.req.init_depth;
        ep->connect.retry_count = event.data.req.retry_cnt;      /* 1174 */
        ep->connect.rnr_retry_count = event.data.req.rnr_retry_cnt;
        ep->connect.data_length = sizeof ep->connect.data;
        memcpy(ep->connect.data, hdr + 1, sizeof ep->connect.data);
        ep->route = event.data.req.primary_path;
        ep->req = event.data.req;
        ep->state = WvEpPassiveConnect;
        complete(listen, STATUS_SUCCESS);
    }
    spin_release(&listen->queue_lock, taken);
}

static void get_ib_request_fn(void *p) { get_ib_request(p); }

/* WvEpIbListenHandler (wv_ep.c:1189-1196). */
static NTSTATUS listen_handler(iba_cm_id *id, iba_cm_event *ev) {
    wv_ep *listen = id->context;
    (void)ev;
    get_ib_request(listen);
    return STATUS_SUCCESS;
}

/* ---- the IOCTLs (PASSIVE_LEVEL) ---------------------------------------------------------- */

/* WvEpBind (wv_ep.c:293-333). */
NTSTATUS wv_ep_bind(wv_ep *ep, uint32_t ip, uint16_t port) {
    if (ep->state != WvEpIdle) {
        return STATUS_NOT_SUPPORTED;
    }
    ep->local_ip = ip;
    ep->local_port = port;
    ep->state = WvEpAddressBound;
    return STATUS_SUCCESS;
}

/* WvEpModify with WV_IO_EP_OPTION_ROUTE (wv_ep.c:249-291). */
NTSTATUS wv_ep_set_route(wv_ep *ep, const ib_path_rec_t *route) {
    if (ep->state != WvEpAddressBound) {
        return STATUS_NOT_SUPPORTED;
    }
    ep->route = *route;
    ep->state = WvEpRouteResolved;
    return STATUS_SUCCESS;
}

typedef struct connect_args {
    wv_ep *ep;
    iba_cm_req *req;
    NTSTATUS status;
} connect_args;

/* wv_ep.c:635-656, under the queue lock. */
static void connect_locked(void *p) {
    connect_args *a = p;
    wv_ep *ep = a->ep;
    if (ep->state != WvEpRouteResolved) {
        a->status = STATUS_NOT_SUPPORTED;
        return;
    }
    /* 641: a second connect overwrites pIbCmId (the id of the first is leaked). */
    a->status = ep->ifc->CM.create_id(cm_handler, ep, &ep->id);
    if (!NT_SUCCESS(a->status)) {
        return;
    }
    ep->ids_created++;
    ep->state = WvEpActiveConnect;
    a->status = ep->ifc->CM.send_req(ep->id, a->req); /* 647 */
    if (NT_SUCCESS(a->status)) {
        ep->pending++; /* WdfRequestRequeue */
    } else {
        ep->state = WvEpDisconnected;
    }
}

/* WvEpConnect + WvEpAsyncConnect (wv_ep.c:588-659, 690-712), the work item's part at
 * PASSIVE_LEVEL; `psn` stands for RtlRandomEx (616). A failure completes the request
 * (WvEpWorkHandler, wv_ep.c:950-952). */
NTSTATUS wv_ep_connect(wv_ep *ep, const fake_qp *qp, uint32_t peer_ip, uint16_t peer_port,
                       const wv_connect_param *param, uint32_t psn) {
    iba_cm_req req;
    uint8_t data[IB_REQ_PDATA_SIZE];
    if (param->data_length > sizeof param->data) {
        return STATUS_INVALID_PARAMETER; /* STATUS_INVALID_BUFFER_SIZE, 701-704 */
    }
    memset(&req, 0, sizeof req);
    ep->peer_ip = peer_ip;
    ep->peer_port = peer_port;
    format_cma_header((rdma_cm_hdr *)data, ep->local_ip, ep->local_port, ep->peer_ip);
    req.service_id = service_id(ep->ep_type, ep->peer_port);
    req.p_primary_path = &ep->route;
    req.p_alt_path = NULL;
    req.qpn = rp_h32(qp->qpn);
    req.qp_type = IB_QPT_RELIABLE_CONN;
    req.starting_psn = psn;
    req.p_pdata = data;
    memcpy(data + sizeof(rdma_cm_hdr), param->data, param->data_length);
    req.pdata_len = (uint8_t)(sizeof(rdma_cm_hdr) + param->data_length);
    req.max_cm_retries = IB_CMA_MAX_CM_RETRIES;
    req.resp_res = param->responder_resources;
    req.init_depth = param->initiator_depth;
    req.remote_resp_timeout = IB_CMA_CM_RESPONSE_TIMEOUT;
    req.flow_ctrl = 1;
    req.local_resp_timeout = IB_CMA_CM_RESPONSE_TIMEOUT;
    req.rnr_retry_cnt = param->rnr_retry_count;
    req.retry_cnt = param->retry_count;
    req.srq = (uint8_t)(qp->srq != 0);
    ep->connect = *param;
    connect_args a = {ep, &req, STATUS_SUCCESS};
    locked(ep->host, &ep->queue_lock, connect_locked, &a);
    if (!NT_SUCCESS(a.status)) {
        complete(ep, a.status);
    }
    return a.status;
}

/* WvEpModifyQpRtr (wv_ep.c:714-750). */
static NTSTATUS modify_qp_rtr(wv_ep *ep, fake_qp *qp, uint8_t resp_res, net32_t psn) {
    ib_qp_mod_t attr;
    NTSTATUS status = ep->ifc->CM.get_qp_attr(ep->id, IB_QPS_INIT, &attr); /* 722 */
    if (!NT_SUCCESS(status)) {
        return status;
    }
    qp_modify(qp, &attr);
    status = ep->ifc->CM.get_qp_attr(ep->id, IB_QPS_RTR, &attr); /* 733 */
    if (!NT_SUCCESS(status)) {
        return status;
    }
    if (ep->state == WvEpPassiveConnect) { /* 738-741 */
        attr.state.rtr.resp_res = resp_res;
        attr.state.rtr.rq_psn = psn;
    }
    qp_modify(qp, &attr);
    return STATUS_SUCCESS;
}

/* WvEpModifyQpRts (wv_ep.c:752-776). */
static NTSTATUS modify_qp_rts(wv_ep *ep, fake_qp *qp, uint8_t init_depth) {
    ib_qp_mod_t attr;
    NTSTATUS status = ep->ifc->CM.get_qp_attr(ep->id, IB_QPS_RTS, &attr); /* 760 */
    if (!NT_SUCCESS(status)) {
        return status;
    }
    if (ep->state == WvEpPassiveConnect) { /* 765-767 */
        attr.state.rts.init_depth = init_depth;
    }
    qp_modify(qp, &attr);
    return STATUS_SUCCESS;
}

typedef struct accept_args {
    wv_ep *ep;
    iba_cm_rep *rep;
    const wv_connect_param *param;
    NTSTATUS status;
} accept_args;

/* wv_ep.c:796-812, under the queue lock. */
static void accept_active_locked(void *p) {
    accept_args *a = p;
    wv_ep *ep = a->ep;
    if (ep->state != WvEpActiveConnect) {
        a->status = STATUS_NOT_SUPPORTED;
        return;
    }
    ep->state = WvEpConnected;
    a->status = ep->ifc->CM.send_rtu(ep->id, a->param->data, a->param->data_length); /* 803 */
    if (NT_SUCCESS(a->status)) {
        complete(ep, a->status);
    } else {
        ep->state = WvEpDisconnected;
    }
}

/* wv_ep.c:852-868, under the queue lock. */
static void accept_passive_locked(void *p) {
    accept_args *a = p;
    wv_ep *ep = a->ep;
    if (ep->state != WvEpPassiveConnect) {
        a->status = STATUS_NOT_SUPPORTED;
        return;
    }
    a->status = ep->ifc->CM.send_rep(ep->id, a->rep); /* 858 */
    if (NT_SUCCESS(a->status)) {
        ep->pending++; /* WdfRequestRequeue */
    } else {
        ep->state = WvEpDisconnected;
    }
}

/* WvEpAccept + WvEpAsyncAccept (wv_ep.c:873-905, 959-981): WvEpAcceptActive (778-814) or
 * WvEpAcceptPassive (816-871); `psn` stands for RtlRandomEx (829). The QP goes to INIT,
 * RTR and RTS before the RTU or the REP. A failure completes the request (950-952). */
NTSTATUS wv_ep_accept(wv_ep *ep, fake_qp *qp, const wv_connect_param *param, uint32_t psn) {
    NTSTATUS status;
    accept_args a = {ep, NULL, param, STATUS_SUCCESS};
    iba_cm_rep rep;
    if (param->data_length > sizeof param->data) {
        return STATUS_INVALID_PARAMETER;
    }
    switch (ep->state) {
    case WvEpActiveConnect:
        /* 789-792: the modify's status is overwritten below (the RTU goes out anyway). */
        status = modify_qp_rtr(ep, qp, 0, 0);
        if (NT_SUCCESS(status)) {
            (void)modify_qp_rts(ep, qp, 0);
        }
        locked(ep->host, &ep->queue_lock, accept_active_locked, &a);
        status = a.status;
        break;
    case WvEpPassiveConnect:
        memset(&rep, 0, sizeof rep);
        rep.qpn = rp_h32(qp->qpn);
        rep.starting_psn = psn;
        rep.p_pdata = param->data;
        rep.pdata_len = param->data_length;
        rep.failover_accepted = IB_FAILOVER_ACCEPT_UNSUPPORTED;
        rep.resp_res = param->responder_resources;
        rep.init_depth = param->initiator_depth;
        rep.flow_ctrl = 1;
        rep.rnr_retry_cnt = param->rnr_retry_count;
        rep.srq = (uint8_t)(qp->srq != 0);
        status = modify_qp_rtr(ep, qp, param->responder_resources, rep.starting_psn); /* 839 */
        if (NT_SUCCESS(status)) {
            status = modify_qp_rts(ep, qp, param->initiator_depth); /* 842 */
        }
        if (NT_SUCCESS(status)) {
            a.rep = &rep;
            locked(ep->host, &ep->queue_lock, accept_passive_locked, &a);
            status = a.status;
        }
        break;
    default:
        status = STATUS_NOT_SUPPORTED;
        break;
    }
    if (!NT_SUCCESS(status)) {
        complete(ep, status);
    }
    return status;
}

typedef struct reject_args {
    wv_ep *ep;
    const void *data;
    uint8_t len;
    NTSTATUS status;
} reject_args;

/* wv_ep.c:1001-1012, under the queue lock. */
static void reject_locked(void *p) {
    reject_args *a = p;
    wv_ep *ep = a->ep;
    if (ep->state != WvEpActiveConnect && ep->state != WvEpPassiveConnect) {
        a->status = STATUS_NOT_SUPPORTED;
        return;
    }
    ep->state = WvEpDisconnected;
    a->status = ep->ifc->CM.send_rej(ep->id, rp_h16(IBCM_REJ_USER_DEFINED), NULL, 0, a->data,
                                     a->len); /* 1008 */
}

/* WvEpReject (wv_ep.c:983-1016). */
NTSTATUS wv_ep_reject(wv_ep *ep, const void *data, uint8_t len) {
    reject_args a = {ep, data, len, STATUS_SUCCESS};
    locked(ep->host, &ep->queue_lock, reject_locked, &a);
    return a.status;
}

typedef struct disconnect_args {
    wv_ep *ep;
    NTSTATUS status;
    int drep;
} disconnect_args;

/* wv_ep.c:1044-1072, the part under the queue lock. */
static void disconnect_locked(void *p) {
    disconnect_args *a = p;
    wv_ep *ep = a->ep;
    switch (ep->state) {
    case WvEpConnected:
        a->status = ep->ifc->CM.send_dreq(ep->id, NULL, 0); /* 1047 */
        if (NT_SUCCESS(a->status)) {
            ep->pending++; /* WdfRequestForwardToIoQueue */
            ep->state = WvEpActiveDisconnect;
            break;
        }
        __attribute__((fallthrough)); /* wv_ep.c:1055 */
    case WvEpActiveDisconnect:
    case WvEpPassiveDisconnect:
        ep->state = WvEpDisconnected;
        a->drep = 1;
        break;
    default:
        a->status = STATUS_INVALID_DEVICE_STATE;
        break;
    }
}

/* WvEpDisconnect (wv_ep.c:1019-1080): DREQ under the lock, or the DREP at PASSIVE_LEVEL
 * after the lock is released (1061). */
NTSTATUS wv_ep_disconnect(wv_ep *ep) {
    disconnect_args a = {ep, STATUS_SUCCESS, 0};
    locked(ep->host, &ep->queue_lock, disconnect_locked, &a);
    if (a.drep) {
        ep->ifc->CM.send_drep(ep->id, NULL, 0);
        a.status = STATUS_SUCCESS; /* WvEpDisconnectQp, 1063-1066 */
        complete(ep, a.status);
    }
    return a.status;
}

typedef struct listen_args {
    wv_ep *ep;
    void *buf;
    uint8_t len;
    uint8_t mask;
    int32_t backlog;
    NTSTATUS status;
} listen_args;

/* wv_ep.c:1232-1247, under the queue lock. */
static void listen_locked(void *p) {
    listen_args *a = p;
    wv_ep *ep = a->ep;
    if (ep->state != WvEpAddressBound) {
        a->status = STATUS_NOT_SUPPORTED;
        return;
    }
    a->status = ep->ifc->CM.create_id(listen_handler, ep, &ep->id); /* 1238 */
    if (!NT_SUCCESS(a->status)) {
        return;
    }
    ep->ids_created++;
    ep->state = WvEpListening;
    a->status = ep->ifc->CM.listen(ep->id, service_id(ep->ep_type, ep->local_port), a->buf,
                                   a->len, a->mask); /* 1246 */
}

/* WvEpListen (wv_ep.c:1198-1253): a bound address listens with the RDMA CM header and
 * IB_REQ_CM_RDMA_CMP_DST_IP, the any address with no compare (1221-1230). */
NTSTATUS wv_ep_listen(wv_ep *ep, int32_t backlog) {
    rdma_cm_hdr hdr;
    listen_args a = {ep, NULL, 0, 0, backlog, STATUS_SUCCESS};
    if (!any_address(ep->local_ip)) {
        format_cma_header(&hdr, ep->local_ip, ep->local_port, ep->local_ip);
        a.buf = &hdr;
        a.len = sizeof hdr;
        a.mask = IB_REQ_CM_RDMA_CMP_DST_IP;
    }
    locked(ep->host, &ep->queue_lock, listen_locked, &a);
    return a.status;
}

typedef struct get_request_args {
    wv_ep *listen;
    wv_ep *ep;
    NTSTATUS status;
} get_request_args;

static void queue_ep_locked(void *p) {
    get_request_args *a = p;
    if (a->ep->state == WvEpIdle) {
        a->ep->state = WvEpQueued;
    } else {
        a->status = STATUS_CONNECTION_ACTIVE;
    }
}

static void forward_locked(void *p) {
    get_request_args *a = p;
    a->listen->pending++;
    a->listen->entry[a->listen->entries++] = a->ep;
}

/* WvEpGetRequest (wv_ep.c:1255-1317): the endpoint queued on the listen, then
 * WvEpGetIbRequest (1307). */
NTSTATUS wv_ep_get_request(wv_ep *listen, wv_ep *ep) {
    get_request_args a = {listen, ep, STATUS_SUCCESS};
    if (listen->state != WvEpListening) {
        return STATUS_NOT_SUPPORTED;
    }
    if (listen->entries >= 8) {
        return STATUS_INVALID_PARAMETER;
    }
    locked(ep->host, &ep->queue_lock, queue_ep_locked, &a);
    if (!NT_SUCCESS(a.status)) {
        return a.status;
    }
    locked(listen->host, &listen->queue_lock, forward_locked, &a);
    /* 1307: WvEpGetIbRequest takes the listen's queue lock (DISPATCH_LEVEL). */
    listen->host->at_dispatch(listen->host->ctx, get_ib_request_fn, listen);
    return STATUS_PENDING;
}

static void destroying_locked(void *p) { ((wv_ep *)p)->state = WvEpDestroying; }

/* WvEpFree (wv_ep.c:195-215), PASSIVE_LEVEL. */
void wv_ep_free(wv_ep *ep) {
    locked(ep->host, &ep->queue_lock, destroying_locked, ep);
    if (ep->id != NULL) {
        ep->ifc->CM.destroy_id(ep->id); /* 206 */
    }
}

/* ---- what the test reads ---------------------------------------------------------------- */

int32_t wv_ep_state(const wv_ep *ep) { return (int32_t)ep->state; }
iba_cm_id *wv_ep_id(const wv_ep *ep) { return ep->id; }
int32_t wv_ep_pending(const wv_ep *ep) { return ep->pending; }
int32_t wv_ep_completions(const wv_ep *ep) { return ep->completions; }
NTSTATUS wv_ep_last_status(const wv_ep *ep) { return ep->last_status; }
int32_t wv_ep_recursions(const wv_ep *ep) { return ep->queue_lock.recursions; }
int32_t wv_ep_ids_created(const wv_ep *ep) { return ep->ids_created; }
void wv_ep_connect_param(const wv_ep *ep, wv_connect_param *out) { *out = ep->connect; }
void wv_ep_req_event(const wv_ep *ep, iba_cm_req_event *out) { *out = ep->req; }
void wv_ep_route(const wv_ep *ep, ib_path_rec_t *out) { *out = ep->route; }
int wv_ep_seen(const wv_ep *ep, int32_t i, seen *out) {
    if (i < 0 || i >= ep->seen.n) {
        return 0;
    }
    *out = ep->seen.log[i];
    return 1;
}
