//! Path information as carried by the REQ (primary and alternate, Table 106) and the LAP
//! (alternate, Table 115). The two messages order the path fields differently, so each has
//! its own view; both parse to the same [`Path`].

use crate::error::{Error, check_width};
use crate::view::view;
use ibcm_iba::Rate;

pub use ibcm_iba::Gid;

/// One path's addressing and timing (the "Primary/Alternate ..." fields of a REQ, or the
/// "Alternate ..." fields of a LAP). "Local" is the sender of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Path {
    /// Local port LID (0xFFFF on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Packet rate, 6 bits.
    pub packet_rate: Rate,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level, 4 bits.
    pub sl: u8,
    /// Subnet local: the remote port is on the local subnet (no GRH needed).
    pub subnet_local: bool,
    /// Local ACK timeout, 5-bit IB time.
    pub local_ack_timeout: u8,
}

impl Path {
    /// Whether the path is present: IBA leaves an absent alternate path all zeros.
    pub fn is_present(&self) -> bool {
        self.local_lid != 0 || self.remote_lid != 0 || self.local_gid != [0; 16]
    }

    /// Checks every field against its width.
    pub fn check(&self) -> Result<(), Error> {
        check_width("FlowLabel", self.flow_label.into(), 20)?;
        check_width("PacketRate", u8::from(self.packet_rate).into(), 6)?;
        check_width("SL", self.sl.into(), 4)?;
        check_width("LocalACKTimeout", self.local_ack_timeout.into(), 5)
    }
}

view! {
    /// A path inside a REQ (44 bytes at CM offset 52 for the primary, 96 for the alternate).
    pub struct ReqPath [base 0, len 44] {
        /// Local port LID.
        local_port_lid / set_local_port_lid: u16(0);
        /// Remote port LID.
        remote_port_lid / set_remote_port_lid: u16(2);
        /// Local port GID.
        local_port_gid / set_local_port_gid: gid(4);
        /// Remote port GID.
        remote_port_gid / set_remote_port_gid: gid(20);
        /// Flow label (20 bits).
        flow_label / set_flow_label: flow(36);
        /// Packet rate (6 bits).
        packet_rate / set_packet_rate: bits(39, 0, 6);
        /// Traffic class.
        traffic_class / set_traffic_class: u8(40);
        /// Hop limit.
        hop_limit / set_hop_limit: u8(41);
        /// SL (4 bits).
        sl / set_sl: bits(42, 4, 4);
        /// Subnet local.
        subnet_local / set_subnet_local: bits(42, 3, 1);
        /// Local ACK timeout (5 bits).
        local_ack_timeout / set_local_ack_timeout: bits(43, 3, 5);
    }
}

view! {
    /// The alternate path inside a LAP (44 bytes at CM offset 20).
    pub struct LapPath [base 0, len 44] {
        /// Alternate local port LID.
        local_port_lid / set_local_port_lid: u16(0);
        /// Alternate remote port LID.
        remote_port_lid / set_remote_port_lid: u16(2);
        /// Alternate local port GID.
        local_port_gid / set_local_port_gid: gid(4);
        /// Alternate remote port GID.
        remote_port_gid / set_remote_port_gid: gid(20);
        /// Alternate flow label (20 bits).
        flow_label / set_flow_label: flow(36);
        /// Alternate traffic class.
        traffic_class / set_traffic_class: u8(39);
        /// Alternate hop limit.
        hop_limit / set_hop_limit: u8(40);
        /// Alternate packet rate (6 bits).
        packet_rate / set_packet_rate: bits(41, 0, 6);
        /// Alternate SL (4 bits).
        sl / set_sl: bits(42, 4, 4);
        /// Alternate subnet local.
        subnet_local / set_subnet_local: bits(42, 3, 1);
        /// Alternate local ACK timeout (5 bits).
        local_ack_timeout / set_local_ack_timeout: bits(43, 3, 5);
    }
}

/// Both path views expose the same fields; this lets one parse/emit serve both layouts.
macro_rules! path_codec {
    ($view:ident) => {
        impl<T: AsRef<[u8]>> $view<T> {
            /// The path's representation.
            pub fn path(&self) -> Path {
                Path {
                    local_lid: self.local_port_lid(),
                    remote_lid: self.remote_port_lid(),
                    local_gid: self.local_port_gid(),
                    remote_gid: self.remote_port_gid(),
                    flow_label: self.flow_label(),
                    packet_rate: Rate::from(self.packet_rate()),
                    traffic_class: self.traffic_class(),
                    hop_limit: self.hop_limit(),
                    sl: self.sl(),
                    subnet_local: self.subnet_local() != 0,
                    local_ack_timeout: self.local_ack_timeout(),
                }
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            /// Writes a path whose fields were checked with [`Path::check`].
            pub fn set_path(&mut self, path: &Path) {
                self.set_local_port_lid(path.local_lid);
                self.set_remote_port_lid(path.remote_lid);
                self.set_local_port_gid(path.local_gid);
                self.set_remote_port_gid(path.remote_gid);
                self.set_flow_label(path.flow_label);
                self.set_packet_rate(path.packet_rate.into());
                self.set_traffic_class(path.traffic_class);
                self.set_hop_limit(path.hop_limit);
                self.set_sl(path.sl);
                self.set_subnet_local(path.subnet_local.into());
                self.set_local_ack_timeout(path.local_ack_timeout);
            }
        }
    };
}

path_codec!(ReqPath);
path_codec!(LapPath);
