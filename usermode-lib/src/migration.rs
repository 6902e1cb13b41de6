//! Path migration (LAP/APR) on a connection endpoint, and the datagram (SIDR) endpoint.

use std::future::Future;

use ibcm_ioctl::iba::QpAttributes;
use ibcm_ioctl::iba::{AprStatus, SidrStatus};
use ibcm_ioctl::{AprIn, EventRecord, LapIn, QpAttrOut, SidrRepIn, SidrReqIn, code, event_type};
use zerocopy::{FromZeros, IntoBytes};

use crate::PathRecord;
use crate::completion::blocking;
use crate::connection::{
    ConnectEndpoint, Listener, failure, inline, path_abi, path_record, private_data as record_data,
    qp_attributes,
};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::provider::Provider;

/// The peer's answer to a LAP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AprReply {
    /// APStatus.
    pub status: AprStatus,
    /// Additional information.
    pub info: Vec<u8>,
    /// APR private data (148 bytes).
    pub private_data: Vec<u8>,
}

/// A LAP the peer sent: the alternate path it proposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LapRequest {
    /// The proposed alternate path (this side's view).
    pub alternate_path: PathRecord,
    /// LAP private data (168 bytes).
    pub private_data: Vec<u8>,
}

impl ConnectEndpoint {
    /// Proposes `alternate` as the connection's alternate path (LAP); completes with the
    /// peer's APR. On Success the alternate path is loaded: read the RTS attributes with
    /// [`qp_attributes`](Self::qp_attributes) and modify the QP.
    pub fn load_alternate_path(
        &self,
        alternate: &PathRecord,
        private_data: &[u8],
    ) -> Result<AprReply> {
        blocking("load alternate path", || {
            self.load_alternate_path_async(alternate, private_data)
        })
    }

    /// [`load_alternate_path`](Self::load_alternate_path) as a future.
    pub fn load_alternate_path_async(
        &self,
        alternate: &PathRecord,
        private_data: &[u8],
    ) -> impl Future<Output = Result<AprReply>> + Send + 'static {
        const OP: &str = "load alternate path";
        let ep = self.0.clone();
        let record = inline::<168>(OP, private_data).map(|(pd, len)| {
            let mut l = LapIn::new_zeroed();
            l.size = LapIn::SIZE;
            l.handle = ep.0.handle;
            l.alternate = path_abi(alternate);
            l.private_data = pd;
            l.private_data_len = len;
            l
        });
        async move {
            let l = record?;
            ep.ioctl(OP, code::LAP, l.as_bytes(), 0).await?;
            let r = ep
                .wait_event(OP, |t| {
                    [
                        event_type::APR_RECEIVED,
                        event_type::TIMEOUT,
                        event_type::DEVICE_REMOVAL,
                    ]
                    .contains(&t)
                })
                .await?;
            if r.event_type != event_type::APR_RECEIVED {
                return Err(failure(OP, &r));
            }
            Ok(AprReply {
                status: AprStatus::from(r.reason as u8),
                info: r.ari.get(..usize::from(r.ari_len)).unwrap_or(&[]).to_vec(),
                private_data: record_data(&r),
            })
        }
    }

    /// Completes when the peer proposes an alternate path (its LAP); answer with
    /// [`answer_alternate_path`](Self::answer_alternate_path).
    pub fn get_alternate_path_request(&self) -> Result<LapRequest> {
        const OP: &str = "get alternate path request";
        let ep = self.0.clone();
        blocking(OP, || async move {
            let r = ep
                .wait_event(OP, |t| {
                    t == event_type::LAP_RECEIVED || t == event_type::DEVICE_REMOVAL
                })
                .await?;
            if r.event_type != event_type::LAP_RECEIVED {
                return Err(failure(OP, &r));
            }
            Ok(LapRequest {
                alternate_path: path_record(&r.alternate),
                private_data: record_data(&r),
            })
        })
    }

    /// Answers a LAP with an APR. For [`AprStatus::Success`] returns the RTS attributes
    /// with the alternate path and migration state REARM, to apply to the QP.
    pub fn answer_alternate_path(
        &self,
        status_code: AprStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<Option<QpAttributes>> {
        const OP: &str = "answer alternate path";
        let mut a = AprIn::new_zeroed();
        a.size = AprIn::SIZE;
        a.handle = self.handle();
        a.status = status_code.into();
        let (buf, len) = inline::<72>(OP, info)?;
        a.info = buf;
        a.info_len = len;
        let (pd, len) = inline::<148>(OP, private_data)?;
        a.private_data = pd;
        a.private_data_len = len;
        let out: QpAttrOut =
            blocking(OP, || self.0.ioctl_out(OP, code::PREPARE_APR, a.as_bytes()))?;
        blocking(OP, || {
            self.0
                .ioctl(OP, code::SEND_APR, self.0.handle_in().as_bytes(), 0)
        })?;
        Ok((status_code == AprStatus::Success).then(|| qp_attributes(&out.attr)))
    }

    /// The QP migrated to its alternate path (the path-migrated async event): primary
    /// and alternate swap in the driver, and later RTS attributes follow.
    pub fn migrate(&self) -> Result<()> {
        blocking("migrate", || {
            self.0
                .ioctl("migrate", code::MIGRATE, self.0.handle_in().as_bytes(), 0)
        })
        .map(|_| ())
    }
}

/// A service resolved with SIDR: where to send UD datagrams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReply {
    /// Status.
    pub status: SidrStatus,
    /// The service's UD QPN.
    pub qpn: u32,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub info: Vec<u8>,
    /// SIDR_REP private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// A datagram endpoint (`IWVDatagramEndpoint`): resolves service IDs to UD QPNs (SIDR).
#[derive(Clone)]
pub struct DatagramEndpoint(pub(crate) Endpoint);

/// A SIDR_REQ that reached a listener, with the endpoint that answers it.
pub struct DatagramRequest {
    /// The endpoint to answer with.
    pub endpoint: DatagramEndpoint,
    /// The service ID asked for.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// SIDR_REQ private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// What a datagram endpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolveParams<'a> {
    /// The service to resolve.
    pub service_id: u64,
    /// Local port.
    pub port: u8,
    /// Partition key.
    pub pkey: u16,
    /// The path to the node offering the service.
    pub path: PathRecord,
    /// How long the responder may take (5-bit IB time).
    pub timeout: u8,
    /// Retries (4 bits).
    pub max_retries: u8,
    /// Private data (<= 216 bytes).
    pub private_data: &'a [u8],
}

impl Provider {
    /// A new datagram endpoint.
    pub fn datagram_endpoint(&self) -> Result<DatagramEndpoint> {
        Ok(DatagramEndpoint(Endpoint::create(
            self,
            "create datagram endpoint",
        )?))
    }
}

impl DatagramEndpoint {
    /// Resolves a service (SIDR_REQ, retried) and completes with the SIDR_REP.
    pub fn resolve(&self, p: &ResolveParams<'_>) -> Result<SidrReply> {
        blocking("resolve", || self.resolve_async(p))
    }

    /// [`resolve`](Self::resolve) as a future.
    pub fn resolve_async(
        &self,
        p: &ResolveParams<'_>,
    ) -> impl Future<Output = Result<SidrReply>> + Send + 'static {
        const OP: &str = "resolve";
        let ep = self.0.clone();
        let record = inline::<216>(OP, p.private_data).map(|(pd, len)| {
            let mut r = SidrReqIn::new_zeroed();
            r.size = SidrReqIn::SIZE;
            r.handle = ep.0.handle;
            r.service_id = p.service_id;
            r.pkey = p.pkey;
            r.port = p.port;
            r.timeout = p.timeout;
            r.max_retries = p.max_retries;
            r.path = path_abi(&p.path);
            r.private_data = pd;
            r.private_data_len = len;
            r
        });
        async move {
            let r = record?;
            ep.ioctl(OP, code::SIDR_REQ, r.as_bytes(), 0).await?;
            let e = ep
                .wait_event(OP, |t| {
                    [
                        event_type::SIDR_REP_RECEIVED,
                        event_type::TIMEOUT,
                        event_type::DEVICE_REMOVAL,
                    ]
                    .contains(&t)
                })
                .await?;
            if e.event_type != event_type::SIDR_REP_RECEIVED {
                return Err(failure(OP, &e));
            }
            Ok(SidrReply {
                status: SidrStatus::from(e.reason as u8),
                qpn: e.remote_qpn,
                qkey: e.remote_psn,
                info: e.ari.get(..usize::from(e.ari_len)).unwrap_or(&[]).to_vec(),
                private_data: record_data(&e),
            })
        }
    }

    /// Answers a SIDR_REQ received through [`Listener::get_datagram_request`].
    pub fn reply(
        &self,
        status_code: SidrStatus,
        qpn: u32,
        qkey: u32,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<()> {
        const OP: &str = "reply";
        let mut r = SidrRepIn::new_zeroed();
        r.size = SidrRepIn::SIZE;
        r.handle = self.0.0.handle;
        r.status = status_code.into();
        r.qpn = qpn;
        r.qkey = qkey;
        let (buf, len) = inline::<72>(OP, info)?;
        r.info = buf;
        r.info_len = len;
        let (pd, len) = inline::<136>(OP, private_data)?;
        r.private_data = pd;
        r.private_data_len = len;
        blocking(OP, || self.0.ioctl(OP, code::SIDR_REP, r.as_bytes(), 0)).map(|_| ())
    }
}

impl Listener {
    /// Completes with the next SIDR_REQ for this listener's service.
    pub fn get_datagram_request(&self) -> Result<DatagramRequest> {
        const OP: &str = "get datagram request";
        let ep = self.0.clone();
        blocking(OP, || async move {
            let r: EventRecord = ep
                .wait_event(OP, |t| {
                    t == event_type::SIDR_REQ_RECEIVED || t == event_type::DEVICE_REMOVAL
                })
                .await?;
            if r.event_type != event_type::SIDR_REQ_RECEIVED {
                return Err(failure(OP, &r));
            }
            Ok(DatagramRequest {
                endpoint: DatagramEndpoint(Endpoint::new(ep.0.provider.clone(), r.new_handle)),
                service_id: r.service_id,
                pkey: r.pkey,
                private_data: record_data(&r),
            })
        })
    }
}
