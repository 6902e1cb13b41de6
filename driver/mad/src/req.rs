//! REQ, ConnectRequest (IBA 12.6.5, Table 106).

use crate::D;
use crate::error::{Error, check_len, check_width};
use crate::path::{Path, ReqPath};
use crate::view::view;
use ibcm_iba::{Mtu, Transport};

/// REQ private data: 92 bytes.
pub const REQ_PRIVATE_DATA_SIZE: usize = 92;
const PRIMARY_PATH: usize = 52;
const ALTERNATE_PATH: usize = 96;
const PATH_LEN: usize = 44;
const PRIVATE_DATA: usize = 140;

view! {
    /// A zero-copy view of a REQ MAD.
    pub struct ReqPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// VendorID (24 bits; IBA 1.4 ECE).
        vendor_id / set_vendor_id: u24(5);
        /// ServiceID.
        service_id / set_service_id: u64(8);
        /// LocalCAGUID.
        local_ca_guid / set_local_ca_guid: u64(16);
        /// LocalQ_Key.
        local_qkey / set_local_qkey: u32(28);
        /// LocalQPN (24 bits).
        local_qpn / set_local_qpn: u24(32);
        /// ResponderResources.
        responder_resources / set_responder_resources: u8(35);
        /// LocalEECN (24 bits).
        local_eecn / set_local_eecn: u24(36);
        /// InitiatorDepth.
        initiator_depth / set_initiator_depth: u8(39);
        /// RemoteEECN (24 bits).
        remote_eecn / set_remote_eecn: u24(40);
        /// RemoteCMResponseTimeout (5 bits).
        remote_cm_response_timeout / set_remote_cm_response_timeout: bits(43, 3, 5);
        /// TransportServiceType (2 bits).
        transport_service_type / set_transport_service_type: bits(43, 1, 2);
        /// End-to-end flow control.
        end_to_end_flow_control / set_end_to_end_flow_control: bits(43, 0, 1);
        /// StartingPSN (24 bits).
        starting_psn / set_starting_psn: u24(44);
        /// LocalCMResponseTimeout (5 bits).
        local_cm_response_timeout / set_local_cm_response_timeout: bits(47, 3, 5);
        /// RetryCount (3 bits).
        retry_count / set_retry_count: bits(47, 0, 3);
        /// PartitionKey.
        partition_key / set_partition_key: u16(48);
        /// PathPacketPayloadMTU (4 bits).
        path_mtu / set_path_mtu: bits(50, 4, 4);
        /// RDCExists.
        rdc_exists / set_rdc_exists: bits(50, 3, 1);
        /// RNRRetryCount (3 bits).
        rnr_retry_count / set_rnr_retry_count: bits(50, 0, 3);
        /// MaxCMRetries (4 bits).
        max_cm_retries / set_max_cm_retries: bits(51, 4, 4);
        /// SRQ.
        srq / set_srq: bits(51, 3, 1);
        /// ExtendedTransportType (3 bits).
        extended_transport_type / set_extended_transport_type: bits(51, 0, 3);
        /// SAPSupported (in the alternate path's last byte).
        sap_supported / set_sap_supported: bits(139, 2, 1);
        /// PrivateData.
        private_data / set_private_data: bytes(140, REQ_PRIVATE_DATA_SIZE);
    }
}

impl<T: AsRef<[u8]>> ReqPacket<T> {
    /// The primary path.
    pub fn primary_path(&self) -> ReqPath<&[u8]> {
        ReqPath::new_unchecked(sub(self.buffer.as_ref(), PRIMARY_PATH))
    }

    /// The alternate path (all zeros when absent).
    pub fn alternate_path(&self) -> ReqPath<&[u8]> {
        ReqPath::new_unchecked(sub(self.buffer.as_ref(), ALTERNATE_PATH))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReqPacket<T> {
    /// The primary path, writable.
    pub fn primary_path_mut(&mut self) -> ReqPath<&mut [u8]> {
        ReqPath::new_unchecked(sub_mut(self.buffer.as_mut(), PRIMARY_PATH))
    }

    /// The alternate path, writable.
    pub fn alternate_path_mut(&mut self) -> ReqPath<&mut [u8]> {
        ReqPath::new_unchecked(sub_mut(self.buffer.as_mut(), ALTERNATE_PATH))
    }
}

fn sub(buf: &[u8], at: usize) -> &[u8] {
    buf.get(D + at..D + at + PATH_LEN).unwrap_or(&[])
}

fn sub_mut(buf: &mut [u8], at: usize) -> &mut [u8] {
    buf.get_mut(D + at..D + at + PATH_LEN).unwrap_or(&mut [])
}

/// A REQ: everything the active side tells the passive side about the connection it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req<'a> {
    /// LocalCommID: the sender's communication ID.
    pub local_comm_id: u32,
    /// VendorID (24 bits; 0 unless ECE is used).
    pub vendor_id: u32,
    /// ServiceID of the service wanted.
    pub service_id: u64,
    /// LocalCAGUID.
    pub local_ca_guid: u64,
    /// LocalQ_Key (RD only).
    pub local_qkey: u32,
    /// LocalQPN (24 bits).
    pub local_qpn: u32,
    /// ResponderResources: RDMA reads/atomics the sender accepts in flight.
    pub responder_resources: u8,
    /// LocalEECN (24 bits; RD only).
    pub local_eecn: u32,
    /// InitiatorDepth: RDMA reads/atomics the sender will have in flight.
    pub initiator_depth: u8,
    /// RemoteEECN (24 bits; RD only).
    pub remote_eecn: u32,
    /// RemoteCMResponseTimeout (5 bits): how long the passive side may take to answer.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (with the extended type when 3).
    pub transport: Transport,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// StartingPSN (24 bits).
    pub starting_psn: u32,
    /// LocalCMResponseTimeout (5 bits): how long the sender may take to answer a REP.
    pub local_cm_response_timeout: u8,
    /// RetryCount (3 bits).
    pub retry_count: u8,
    /// PartitionKey.
    pub partition_key: u16,
    /// PathPacketPayloadMTU (4 bits).
    pub path_mtu: Mtu,
    /// RDCExists.
    pub rdc_exists: bool,
    /// RNRRetryCount (3 bits).
    pub rnr_retry_count: u8,
    /// MaxCMRetries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// The primary path.
    pub primary_path: Path,
    /// The alternate path (all zeros when absent).
    pub alternate_path: Path,
    /// SAPSupported.
    pub sap_supported: bool,
    /// PrivateData: the whole 92-byte field on parse; at most 92 bytes on emit.
    pub private_data: &'a [u8],
}

impl<'a> Req<'a> {
    /// Reads a REQ from a MAD buffer (the header is not checked here).
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = ReqPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            vendor_id: p.vendor_id(),
            service_id: p.service_id(),
            local_ca_guid: p.local_ca_guid(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            responder_resources: p.responder_resources(),
            local_eecn: p.local_eecn(),
            initiator_depth: p.initiator_depth(),
            remote_eecn: p.remote_eecn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            transport: Transport::from_wire(
                p.transport_service_type(),
                p.extended_transport_type(),
            ),
            end_to_end_flow_control: p.end_to_end_flow_control() != 0,
            starting_psn: p.starting_psn(),
            local_cm_response_timeout: p.local_cm_response_timeout(),
            retry_count: p.retry_count(),
            partition_key: p.partition_key(),
            path_mtu: Mtu::from(p.path_mtu()),
            rdc_exists: p.rdc_exists() != 0,
            rnr_retry_count: p.rnr_retry_count(),
            max_cm_retries: p.max_cm_retries(),
            srq: p.srq() != 0,
            primary_path: p.primary_path().path(),
            alternate_path: p.alternate_path().path(),
            sap_supported: p.sap_supported() != 0,
            private_data: field_of(buf, PRIVATE_DATA, REQ_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks every field against its width and the private data against 92 bytes.
    pub fn check(&self) -> Result<(), Error> {
        check_width("VendorID", self.vendor_id.into(), 24)?;
        check_width("LocalQPN", self.local_qpn.into(), 24)?;
        check_width("LocalEECN", self.local_eecn.into(), 24)?;
        check_width("RemoteEECN", self.remote_eecn.into(), 24)?;
        check_width(
            "RemoteCMResponseTimeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        check_width("StartingPSN", self.starting_psn.into(), 24)?;
        check_width(
            "LocalCMResponseTimeout",
            self.local_cm_response_timeout.into(),
            5,
        )?;
        check_width("RetryCount", self.retry_count.into(), 3)?;
        check_width("PathPacketPayloadMTU", u8::from(self.path_mtu).into(), 4)?;
        check_width("RNRRetryCount", self.rnr_retry_count.into(), 3)?;
        check_width("MaxCMRetries", self.max_cm_retries.into(), 4)?;
        check_width(
            "ExtendedTransportType",
            self.transport.to_wire().1.into(),
            3,
        )?;
        self.primary_path.check()?;
        self.alternate_path.check()?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            REQ_PRIVATE_DATA_SIZE,
        )
    }

    /// Writes the checked fields into a zeroed MAD buffer.
    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = ReqPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_vendor_id(self.vendor_id);
        p.set_service_id(self.service_id);
        p.set_local_ca_guid(self.local_ca_guid);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_responder_resources(self.responder_resources);
        p.set_local_eecn(self.local_eecn);
        p.set_initiator_depth(self.initiator_depth);
        p.set_remote_eecn(self.remote_eecn);
        p.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        let (service_type, extended) = self.transport.to_wire();
        p.set_transport_service_type(service_type);
        p.set_end_to_end_flow_control(self.end_to_end_flow_control.into());
        p.set_starting_psn(self.starting_psn);
        p.set_local_cm_response_timeout(self.local_cm_response_timeout);
        p.set_retry_count(self.retry_count);
        p.set_partition_key(self.partition_key);
        p.set_path_mtu(self.path_mtu.into());
        p.set_rdc_exists(self.rdc_exists.into());
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_max_cm_retries(self.max_cm_retries);
        p.set_srq(self.srq.into());
        p.set_extended_transport_type(extended);
        p.primary_path_mut().set_path(&self.primary_path);
        p.alternate_path_mut().set_path(&self.alternate_path);
        p.set_sap_supported(self.sap_supported.into());
        p.set_private_data(self.private_data);
    }
}

/// The bytes of a fixed-size CM field at `at` (CM offset) of a checked MAD buffer.
pub(crate) fn field_of(buf: &[u8], at: usize, len: usize) -> &[u8] {
    crate::field::bytes(buf, D + at, len)
}
