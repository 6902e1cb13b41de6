//! Connection endpoints, listeners and connection requests: the WinVerbs
//! `IWVConnectEndpoint` / NetworkDirect `IND2Connector` + `IND2Listener` shape, with every
//! operation blocking, as a future (`*_async`), and overlapped (`ibcm::spawn`).

use std::future::Future;

use ibcm_ioctl::convert::transport_to_abi;
pub(crate) use ibcm_ioctl::convert::{path_of_abi as path_record, path_to_abi as path_abi};
use ibcm_ioctl::iba::{AttributeId, Failover, IpHeader, Mtu, QpAttributes, QpState, RejReason};
use ibcm_ioctl::{
    ConnectIn, EventRecord, FormatRepIn, GetQpAttrIn, ListenIn, MraIn, PrivateDataIn, QpAttrOut,
    QpTransitionsOut, QueryOut, RejIn, code, ep_state, event_type, flags, qp_state, status,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::completion::{blocking, recycle_buffer};
use crate::endpoint::Endpoint;
use crate::error::{Detail, Error, Result, STATUS_CONNECTION_DISCONNECTED};
use crate::provider::Provider;
use crate::{AcceptParams, ConnectParams, ListenParams, PathRecord};

pub(crate) use ibcm_ioctl::convert::qp_attr_of_abi as qp_attributes;

pub(crate) fn private_data(r: &EventRecord) -> Vec<u8> {
    r.private_data
        .get(..usize::from(r.private_data_len))
        .unwrap_or(&[])
        .to_vec()
}

fn too_long(operation: &'static str) -> Error {
    Error::new(operation, status::INVALID_PARAMETER)
}

/// Copies `data` into an inline field, failing (before any system call) if it is longer.
pub(crate) fn inline<const N: usize>(
    operation: &'static str,
    data: &[u8],
) -> Result<([u8; N], u8)> {
    let mut buf = [0u8; N];
    let dst = buf
        .get_mut(..data.len())
        .ok_or_else(|| too_long(operation))?;
    dst.copy_from_slice(data);
    Ok((buf, data.len() as u8))
}

/// The failure an event means for `operation`: a REJ, a timeout, or device removal.
/// The `T` record at `offset` of an IOCTL's output.
fn record_at<T: FromBytes>(operation: &'static str, out: &[u8], offset: usize) -> Result<T> {
    out.get(offset..offset + core::mem::size_of::<T>())
        .and_then(|b| T::read_from_bytes(b).ok())
        .ok_or(Error::new(operation, status::INFO_LENGTH_MISMATCH))
}

pub(crate) fn failure(operation: &'static str, r: &EventRecord) -> Error {
    match r.event_type {
        event_type::REJECTED => Error {
            operation,
            status: status::CONNECTION_REFUSED,
            detail: Detail::Rejected {
                reason: RejReason::from(r.reason),
                private_data: private_data(r),
            },
        },
        event_type::TIMEOUT => Error {
            operation,
            status: status::IO_TIMEOUT,
            detail: Detail::Timeout {
                message: AttributeId::from(u16::from(r.message)),
            },
        },
        _ => Error::new(operation, r.status),
    }
}

/// Whether an event (type `t`, `message` byte) ends an established connection without
/// the application's DREQ: the peer's DREQ, the port's loss, a REJ, or a DREP or DREQ
/// timeout that answer the CM's own DREQ. While the application's DREQ is out
/// (`own_dreq`) every one of them is its disconnect's: a crossing DREQ it answers, a DREP,
/// timeout or REJ ends it, a removal fails it. A LAP's timeout leaves the connection as
/// it was (IBA 12.8.1), so it is not one.
fn ends_connection(t: u32, message: u8, own_dreq: bool) -> bool {
    !own_dreq
        && match t {
            event_type::DREQ_RECEIVED
            | event_type::DEVICE_REMOVAL
            | event_type::REJECTED
            | event_type::DREP_RECEIVED => true,
            event_type::TIMEOUT => AttributeId::from(u16::from(message)) == AttributeId::Dreq,
            _ => false,
        }
}

/// What the active side learns when the REP arrives: the peer's answer and the QP
/// attributes for RTR and RTS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectReply {
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The peer's starting PSN.
    pub remote_psn: u32,
    /// The peer's responder resources.
    pub peer_responder_resources: u8,
    /// The peer's initiator depth.
    pub peer_initiator_depth: u8,
    /// Whether the peer accepted the alternate path.
    pub failover_accepted: Failover,
    /// REP private data (196 bytes).
    pub private_data: Vec<u8>,
    /// INIT with the values the REP settled. A QP moved to INIT before the REQ with
    /// [`ConnectParams::init_attributes`] needs INIT -> INIT with these before RTR only
    /// where they differ ([`ConnectReply::init_again`]): when the REP's initiator depth
    /// takes this side's responder resources to 0 (REMOTE_READ | REMOTE_ATOMIC go), or
    /// from 0 to more (a peer answering more than the REQ offered; they come). rdma_cm
    /// always makes that transition (Linux cma.c `cma_modify_qp_rtr`, rdma-core at
    /// 691953d8d librdmacm/cma.c:1282-1290 `ucma_modify_qp_rtr`: "Need to update QP
    /// attributes from default values"), because its QP was made with no access flags at
    /// all (cma.c `cma_ib_init_qp_attr`: `qp_access_flags = 0`).
    pub init: QpAttributes,
    /// INIT -> RTR.
    pub rtr: QpAttributes,
    /// RTR -> RTS.
    pub rts: QpAttributes,
}

impl ConnectReply {
    /// The INIT -> INIT a QP moved to INIT with `before` (the REQ's
    /// [`ConnectParams::init_attributes`]) needs before RTR: [`ConnectReply::init`] where
    /// it differs from `before`, nothing where it does not.
    pub fn init_again(&self, before: &QpAttributes) -> Option<&QpAttributes> {
        (self.init != *before).then_some(&self.init)
    }
}

/// The transitions the passive side makes between formatting and sending its REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpTransitions {
    /// Reset -> INIT.
    pub init: QpAttributes,
    /// INIT -> RTR.
    pub rtr: QpAttributes,
    /// RTR -> RTS.
    pub rts: QpAttributes,
}

/// A connection endpoint (`IWVConnectEndpoint`): the active side of a connection, or the
/// passive side handed out by [`Listener::get_request`]. Dropping it destroys it: a
/// connection still up is torn down by the driver in the background.
#[derive(Clone)]
pub struct ConnectEndpoint(pub(crate) Endpoint);

impl Provider {
    /// A new, idle connection endpoint.
    pub fn connect_endpoint(&self) -> Result<ConnectEndpoint> {
        Ok(ConnectEndpoint(Endpoint::create(self, "create endpoint")?))
    }

    /// A listener for REQs matching `params`.
    pub fn listen(&self, params: &ListenParams) -> Result<Listener> {
        const OP: &str = "listen";
        let ep = Endpoint::create(self, OP)?;
        let mut l = ListenIn::new_zeroed();
        l.size = ListenIn::SIZE;
        l.handle = ep.0.handle;
        l.service_id = params.service_id;
        l.service_mask = params.service_mask;
        l.backlog = params.backlog;
        l.port = params.port.unwrap_or(0);
        if let Some((offset, bytes)) = &params.compare {
            let (buf, len) = inline::<92>(OP, bytes)?;
            l.compare = buf;
            l.compare_len = len;
            l.compare_offset = *offset;
        }
        blocking(OP, || ep.ioctl(OP, code::LISTEN, l.as_bytes(), 0))?;
        Ok(Listener(ep))
    }
}

impl ConnectEndpoint {
    /// The driver's handle (per file handle; meaningless to other processes).
    pub fn handle(&self) -> u64 {
        self.0.0.handle
    }

    /// Sends the REQ and completes when the REP arrives, with the RTR and RTS attributes
    /// (then transition the QP and call [`rtu`](Self::rtu)). A REJ or a timeout fails it.
    pub fn connect(&self, params: &ConnectParams<'_>) -> Result<ConnectReply> {
        blocking("connect", || self.connect_async(params))
    }

    /// [`connect`](Self::connect) as a future. The REQ goes out when this is called, as an
    /// overlapped `DeviceIoControl` is issued when made: the future holds only the pending
    /// answer (not the 240-byte record), and awaiting it gives the answer.
    pub fn connect_async(
        &self,
        params: &ConnectParams<'_>,
    ) -> impl Future<Output = Result<ConnectReply>> + Send + 'static {
        const OP: &str = "connect";
        let ep = &self.0;
        // A new connection on this endpoint: no DREQ of the application's is out.
        ep.own_dreq_over(false);
        let record = (|| {
            let mut c = ConnectIn::new_zeroed();
            c.size = ConnectIn::SIZE;
            c.handle = ep.0.handle;
            c.service_id = params.service_id;
            c.qpn = params.qpn;
            c.pkey = params.pkey;
            c.port = params.port;
            c.transport = transport_to_abi(params.transport);
            c.path_mtu = params.path_mtu.into();
            c.responder_resources = params.responder_resources;
            c.initiator_depth = params.initiator_depth;
            c.remote_cm_response_timeout = params.remote_cm_response_timeout;
            c.local_cm_response_timeout = params.local_cm_response_timeout;
            c.retry_count = params.retry_count;
            c.rnr_retry_count = params.rnr_retry_count;
            c.max_cm_retries = params.max_cm_retries;
            if let Some(psn) = params.starting_psn {
                c.flags |= flags::PSN_GIVEN;
                c.starting_psn = psn;
            }
            if params.srq {
                c.flags |= flags::SRQ;
            }
            if params.flow_control {
                c.flags |= flags::FLOW_CONTROL;
            }
            c.primary = path_abi(&params.primary_path);
            if let Some(alt) = &params.alternate_path {
                c.flags |= flags::ALTERNATE_PATH;
                c.alternate = path_abi(alt);
            }
            let (pd, len) = inline::<92>(OP, params.private_data)?;
            c.private_data = pd;
            c.private_data_len = len;
            Ok(c)
        })();
        // The call completes with the answer: the REP record and the QP transitions after
        // it (one call, as NetworkDirect's Connect).
        let size = EventRecord::SIZE as usize;
        let answer = record.map(|c| ep.ioctl_answer(OP, code::CONNECT, c.as_bytes(), 2 * size));
        async move {
            let out = answer?.await?;
            let r: EventRecord = record_at(OP, &out, 0)?;
            if r.event_type != event_type::REP_RECEIVED {
                recycle_buffer(out);
                return Err(failure(OP, &r));
            }
            let qp = record_at::<QpTransitionsOut>(OP, &out, size);
            recycle_buffer(out);
            let qp = qp?;
            Ok(ConnectReply {
                remote_qpn: r.remote_qpn,
                remote_psn: r.remote_psn,
                peer_responder_resources: r.peer_responder_resources,
                peer_initiator_depth: r.peer_initiator_depth,
                failover_accepted: Failover::from(r.failover_accepted),
                private_data: private_data(&r),
                init: qp_attributes(&qp.init),
                rtr: qp_attributes(&qp.rtr),
                rts: qp_attributes(&qp.rts),
            })
        }
    }

    /// Sends the RTU after [`connect`](Self::connect) (WinVerbs: `Accept` on the active
    /// side): the connection is established.
    pub fn rtu(&self, private_data: &[u8]) -> Result<()> {
        blocking("rtu", || self.rtu_async(private_data))
    }

    /// [`rtu`](Self::rtu) as a future. The RTU goes out when this is called (as
    /// [`connect_async`](Self::connect_async)'s REQ): the future holds only the request.
    pub fn rtu_async(
        &self,
        private_data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        const OP: &str = "rtu";
        let ioctl = self
            .private_data_in(OP, private_data)
            .map(|p| self.0.ioctl(OP, code::RTU, p.as_bytes(), 0));
        async move { ioctl?.await.map(|_| ()) }
    }

    fn private_data_in(&self, operation: &'static str, data: &[u8]) -> Result<PrivateDataIn> {
        inline::<224>(operation, data).map(|(buf, len)| {
            let mut p = PrivateDataIn::new_zeroed();
            p.size = PrivateDataIn::SIZE;
            p.handle = self.handle();
            p.private_data = buf;
            p.private_data_len = len;
            p
        })
    }

    /// An IOCTL carrying private data, issued when the future is first polled.
    fn private_data_op(
        &self,
        operation: &'static str,
        code: u32,
        data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        let ep = self.0.clone();
        let record = self.private_data_in(operation, data);
        async move {
            let ioctl = {
                let p = record?;
                ep.ioctl(operation, code, p.as_bytes(), 0)
            };
            ioctl.await.map(|_| ())
        }
    }

    /// Pre-REP: formats the REP and returns the QP transitions to make before
    /// [`accept`](Self::accept) sends it.
    pub fn prepare_accept(&self, params: &AcceptParams<'_>) -> Result<QpTransitions> {
        blocking("accept", || self.prepare_accept_async(params))
    }

    /// [`prepare_accept`](Self::prepare_accept) as a future (the FORMAT_REP is issued
    /// when this is called): what an operation started with [`spawn`](crate::spawn)
    /// awaits, since a blocking call on the thread that completes requests fails.
    pub fn prepare_accept_async(
        &self,
        params: &AcceptParams<'_>,
    ) -> impl Future<Output = Result<QpTransitions>> + Send + 'static {
        const OP: &str = "accept";
        let mut r = FormatRepIn::new_zeroed();
        r.size = FormatRepIn::SIZE;
        r.handle = self.handle();
        r.qpn = params.qpn;
        r.responder_resources = params.responder_resources;
        r.initiator_depth = params.initiator_depth;
        r.rnr_retry_count = params.rnr_retry_count;
        r.failover_accepted = params.failover_accepted.into();
        if let Some(psn) = params.starting_psn {
            r.flags |= flags::PSN_GIVEN;
            r.starting_psn = psn;
        }
        if params.srq {
            r.flags |= flags::SRQ;
        }
        if params.flow_control {
            r.flags |= flags::FLOW_CONTROL;
        }
        let formatted = inline::<196>(OP, params.private_data).map(|(pd, len)| {
            r.private_data = pd;
            r.private_data_len = len;
            self.0
                .ioctl_out::<QpTransitionsOut>(OP, code::FORMAT_REP, r.as_bytes())
        });
        async move {
            let out = formatted?.await?;
            Ok(QpTransitions {
                init: qp_attributes(&out.init),
                rtr: qp_attributes(&out.rtr),
                rts: qp_attributes(&out.rts),
            })
        }
    }

    /// Sends the REP formatted by [`prepare_accept`](Self::prepare_accept) and completes
    /// when the RTU arrives (or the QP reports traffic, see
    /// [`established`](Self::established)).
    pub fn accept(&self) -> Result<()> {
        blocking("accept", || self.accept_async())
    }

    /// [`accept`](Self::accept) as a future.
    pub fn accept_async(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        const OP: &str = "accept";
        let ep = self.0.clone();
        async move {
            // The REP goes out and the call completes with the answer (NetworkDirect's
            // Accept).
            let out = ep
                .ioctl_answer(
                    OP,
                    code::SEND_REP,
                    ep.handle_in().as_bytes(),
                    EventRecord::SIZE as usize,
                )
                .await?;
            let r = record_at::<EventRecord>(OP, &out, 0);
            recycle_buffer(out);
            let r = r?;
            match r.event_type {
                event_type::RTU_RECEIVED => Ok(()),
                // A DREQ means the RTU was lost but the connection was established; leave
                // the DREQ for notify_disconnect.
                event_type::DREQ_RECEIVED => {
                    ep.requeue(r);
                    Ok(())
                }
                _ => Err(failure(OP, &r)),
            }
        }
    }

    /// Rejects the connection request (or the REP) with `reason` and private data.
    pub fn reject(&self, reason: RejReason, private_data: &[u8]) -> Result<()> {
        blocking("reject", || self.reject_async(reason, private_data))
    }

    /// [`reject`](Self::reject) as a future (the REJ is issued when this is called).
    pub fn reject_async(
        &self,
        reason: RejReason,
        private_data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        const OP: &str = "reject";
        let mut r = RejIn::new_zeroed();
        r.size = RejIn::SIZE;
        r.handle = self.handle();
        r.reason = reason.into();
        let ioctl = inline::<148>(OP, private_data).map(|(pd, len)| {
            r.private_data = pd;
            r.private_data_len = len;
            self.0.ioctl(OP, code::REJ, r.as_bytes(), 0)
        });
        async move { ioctl?.await.map(|_| ()) }
    }

    /// Sends an MRA: the answer will take up to `service_timeout` (5-bit IB time) longer.
    pub fn mra(&self, service_timeout: u8, private_data: &[u8]) -> Result<()> {
        const OP: &str = "mra";
        let mut m = MraIn::new_zeroed();
        m.size = MraIn::SIZE;
        m.handle = self.handle();
        m.service_timeout = service_timeout;
        let (pd, len) = inline::<222>(OP, private_data)?;
        m.private_data = pd;
        m.private_data_len = len;
        blocking(OP, || self.0.ioctl(OP, code::MRA, m.as_bytes(), 0)).map(|_| ())
    }

    /// Disconnects: sends a DREQ and completes when the DREP (or a crossing DREQ,
    /// answered) arrives or the DREQ times out; if the peer's DREQ came first, answers it
    /// with a DREP; if the connection is already ending (a DREQ out: the CM's own for a
    /// stale connection, or another disconnect's) or in timewait, there is nothing to do.
    /// Either way the connection then waits out timewait in the driver.
    pub fn disconnect(&self, private_data: &[u8]) -> Result<()> {
        blocking("disconnect", || self.disconnect_async(private_data))
    }

    /// [`disconnect`](Self::disconnect) as a future.
    pub fn disconnect_async(
        &self,
        private_data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        const OP: &str = "disconnect";
        let me = self.clone();
        let dreq = self.private_data_op(
            OP,
            code::DREQ,
            private_data.get(..220).unwrap_or(private_data),
        );
        let drep = self.private_data_op(OP, code::DREP, private_data);
        async move {
            // The DREQ first (the usual case costs no QUERY); only a refusal asks why,
            // which also covers a peer's DREQ that arrives between a check and the DREQ.
            // From just before it is issued, what answers it is this call's; a refusal
            // gives the events back to a watcher (notify_disconnect).
            me.0.own_dreq_out();
            if let Err(e) = dreq.await {
                me.0.own_dreq_over(true);
                if e.status != status::INVALID_DEVICE_STATE {
                    return Err(e);
                }
                return match me.query_async().await?.state {
                    ep_state::DREQ_RCVD => drep.await,
                    // Already ending: the CM's own DREQ (a stale connection) or another
                    // disconnect's is out, and its answer ends it; or it has ended.
                    ep_state::DREQ_SENT | ep_state::TIMEWAIT => Ok(()),
                    _ => Err(e),
                };
            }
            let r =
                me.0.wait_event(OP, |t| {
                    [
                        event_type::DREP_RECEIVED,
                        event_type::DREQ_RECEIVED,
                        event_type::TIMEOUT,
                        event_type::REJECTED,
                        event_type::DEVICE_REMOVAL,
                    ]
                    .contains(&t)
                })
                .await?;
            match r.event_type {
                event_type::DREP_RECEIVED | event_type::REJECTED => Ok(()),
                event_type::DREQ_RECEIVED => drep.await,
                event_type::TIMEOUT => Ok(()),
                _ => Err(failure(OP, &r)),
            }
        }
    }

    /// Completes when the connection ends without this application's DREQ: with the
    /// DREQ's private data when the peer asks to disconnect (answer with
    /// [`disconnect`](Self::disconnect)); with the CM's reason when the connection ended
    /// otherwise: a REJ (its reason), the CM's own DREQ for a stale connection
    /// (IBA 12.9.8.3.1) answered (STATUS_CONNECTION_DISCONNECTED) or unanswered (a
    /// DREQ timeout), or the port gone. An rdma_cm application learns each of these as
    /// an event too (cma.c `cma_ib_handler`: IB_CM_DREQ_RECEIVED, IB_CM_DREP_RECEIVED and
    /// IB_CM_DREQ_ERROR as RDMA_CM_EVENT_DISCONNECTED, a REJ as REJECTED, the device's
    /// loss as DEVICE_REMOVAL), so one waiting here never outlives its connection. While
    /// the application's own DREQ is out, everything that ends the connection is its
    /// disconnect's, and this waits on.
    pub fn notify_disconnect(&self) -> Result<Vec<u8>> {
        blocking("notify disconnect", || self.notify_disconnect_async())
    }

    /// [`notify_disconnect`](Self::notify_disconnect) as a future.
    pub fn notify_disconnect_async(
        &self,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        const OP: &str = "notify disconnect";
        let ep = self.0.clone();
        async move {
            let r = ep.wait_event_knowing_own_dreq(OP, ends_connection).await?;
            match r.event_type {
                event_type::DREQ_RECEIVED => Ok(private_data(&r)),
                event_type::DREP_RECEIVED => Err(Error::new(OP, STATUS_CONNECTION_DISCONNECTED)),
                _ => Err(failure(OP, &r)),
            }
        }
    }

    /// Completes when timewait is over: the QP may be reused.
    pub fn wait_timewait(&self) -> Result<()> {
        blocking("wait timewait", || self.wait_timewait_async())
    }

    /// [`wait_timewait`](Self::wait_timewait) as a future.
    pub fn wait_timewait_async(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        const OP: &str = "wait timewait";
        let ep = self.0.clone();
        async move {
            let r = ep
                .wait_event(OP, |t| {
                    t == event_type::TIMEWAIT_EXIT || t == event_type::DEVICE_REMOVAL
                })
                .await?;
            if r.event_type == event_type::TIMEWAIT_EXIT {
                Ok(())
            } else {
                Err(failure(OP, &r))
            }
        }
    }

    /// The QP received traffic before the RTU: the passive side is established.
    pub fn established(&self) -> Result<()> {
        blocking("established", || {
            self.0.ioctl(
                "established",
                code::ESTABLISHED,
                self.0.handle_in().as_bytes(),
                0,
            )
        })
        .map(|_| ())
    }

    /// The endpoint's state, the peer's read limits, paths and last private data.
    pub fn query(&self) -> Result<QueryOut> {
        blocking("query", || self.query_async())
    }

    fn query_async(&self) -> impl Future<Output = Result<QueryOut>> + Send + 'static {
        let ep = self.0.clone();
        async move {
            ep.ioctl_out("query", code::QUERY, ep.handle_in().as_bytes())
                .await
        }
    }

    /// QP attributes for a transition.
    pub fn qp_attributes(&self, state: QpState) -> Result<QpAttributes> {
        blocking("get QP attributes", || self.qp_attributes_async(state))
    }

    /// [`qp_attributes`](Self::qp_attributes) as a future (inside an operation started
    /// with [`spawn`](crate::spawn): the active side's INIT attributes after the REP).
    pub fn qp_attributes_async(
        &self,
        state: QpState,
    ) -> impl Future<Output = Result<QpAttributes>> + Send + 'static {
        let code = match state {
            QpState::Init => qp_state::INIT,
            QpState::Rtr => qp_state::RTR,
            QpState::Rts => qp_state::RTS,
        };
        let ep = self.0.clone();
        async move { qp_attr(&ep, "get QP attributes", code).await }
    }

    /// Fails every operation waiting on this endpoint with STATUS_CANCELLED.
    pub fn cancel(&self) {
        self.0.cancel();
    }

    /// (GET_EVENT system calls, event records received) on this endpoint.
    pub fn event_stats(&self) -> (u64, u64) {
        self.0.event_stats()
    }
}

async fn qp_attr(ep: &Endpoint, op: &'static str, state: u32) -> Result<QpAttributes> {
    let q = GetQpAttrIn {
        size: GetQpAttrIn::SIZE,
        reserved: 0,
        handle: ep.0.handle,
        qp_state: state,
        reserved1: 0,
    };
    let out: QpAttrOut = ep.ioctl_out(op, code::GET_QP_ATTR, q.as_bytes()).await?;
    Ok(qp_attributes(&out.attr))
}

/// A listener (`IND2Listener`): REQs that match it become [`ConnectionRequest`]s.
pub struct Listener(pub(crate) Endpoint);

/// A REQ that reached a listener, with the new endpoint that answers it.
pub struct ConnectionRequest {
    /// The endpoint to accept, reject or MRA with.
    pub endpoint: ConnectEndpoint,
    /// The service ID asked for.
    pub service_id: u64,
    /// The peer's CA GUID.
    pub remote_ca_guid: u64,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The port the REQ arrived on.
    pub port: u8,
    /// Partition key.
    pub pkey: u16,
    /// Primary path (this side's view).
    pub primary_path: PathRecord,
    /// Alternate path.
    pub alternate_path: Option<PathRecord>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The peer's responder resources: the most this side may use as initiator depth.
    pub peer_responder_resources: u8,
    /// The peer's initiator depth.
    pub peer_initiator_depth: u8,
    /// REQ private data (92 bytes).
    pub private_data: Vec<u8>,
}

impl ConnectionRequest {
    /// The RDMA-CM IP header at the start of the private data, if it carries one.
    pub fn ip_header(&self) -> Option<IpHeader> {
        IpHeader::parse(&self.private_data).ok()
    }
}

impl Listener {
    /// Completes with the next connection request.
    pub fn get_request(&self) -> Result<ConnectionRequest> {
        blocking("get request", || self.get_request_async())
    }

    /// [`get_request`](Self::get_request) as a future.
    pub fn get_request_async(
        &self,
    ) -> impl Future<Output = Result<ConnectionRequest>> + Send + 'static {
        const OP: &str = "get request";
        let ep = self.0.clone();
        async move {
            let r = ep
                .wait_event(OP, |t| {
                    t == event_type::REQ_RECEIVED || t == event_type::DEVICE_REMOVAL
                })
                .await?;
            if r.event_type != event_type::REQ_RECEIVED {
                return Err(failure(OP, &r));
            }
            Ok(ConnectionRequest {
                endpoint: ConnectEndpoint(Endpoint::new(ep.0.provider.clone(), r.new_handle)),
                service_id: r.service_id,
                remote_ca_guid: r.remote_ca_guid,
                remote_qpn: r.remote_qpn,
                port: r.port,
                pkey: r.pkey,
                primary_path: path_record(&r.primary),
                alternate_path: (r.has_alternate != 0).then(|| path_record(&r.alternate)),
                path_mtu: Mtu::from(r.path_mtu),
                peer_responder_resources: r.peer_responder_resources,
                peer_initiator_depth: r.peer_initiator_depth,
                private_data: private_data(&r),
            })
        }
    }

    /// Fails a pending [`get_request`](Self::get_request) with STATUS_CANCELLED.
    pub fn cancel(&self) {
        self.0.cancel();
    }

    /// (GET_EVENT system calls, event records received) on this listener.
    pub fn event_stats(&self) -> (u64, u64) {
        self.0.event_stats()
    }
}
