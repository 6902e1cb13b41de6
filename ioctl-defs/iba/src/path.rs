//! A path as a path record (IBA 15.2.5.16) gives it, from one side's point of view: what a
//! CM user passes to connect and what the CM hands back in its QP attributes.

use crate::enums::Rate;

/// A 128-bit GID, in network byte order.
pub type Gid = [u8; 16];

/// A path as a path record gives it, from this side's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// Local port LID.
    pub slid: u16,
    /// Remote port LID.
    pub dlid: u16,
    /// Local port GID.
    pub sgid: Gid,
    /// Remote port GID.
    pub dgid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Static rate.
    pub rate: Rate,
    /// Packet life time (5-bit IB time).
    pub packet_life_time: u8,
    /// The remote port is on the local subnet.
    pub subnet_local: bool,
}

impl PathRecord {
    /// Whether the path is present: IBA leaves an absent alternate path all zeros.
    pub fn is_present(&self) -> bool {
        self.slid != 0 || self.dlid != 0 || self.sgid != [0; 16] || self.dgid != [0; 16]
    }
}
