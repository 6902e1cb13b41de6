//! Per-manager counters, by CM attribute, like Linux's `cm_counters` in sysfs.

use ibcm_mad::AttributeId;

/// Counts by attribute: REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP, APR
/// (index = attribute ID - 0x10), plus ClassPortInfo at index 11.
pub const COUNTED_ATTRIBUTES: usize = 12;

/// Message counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// MADs sent for the first time.
    pub sent: [u64; COUNTED_ATTRIBUTES],
    /// MADs re-sent after a timeout.
    pub retries: [u64; COUNTED_ATTRIBUTES],
    /// MADs received and accepted.
    pub received: [u64; COUNTED_ATTRIBUTES],
    /// Duplicates received (answered from state, no event).
    pub duplicates: [u64; COUNTED_ATTRIBUTES],
    /// MADs that failed to parse.
    pub malformed: u64,
    /// MADs for no known CEP, or in a state that does not take them.
    pub unmatched: u64,
    /// REQs dropped because their listen's backlog was full.
    pub backlog_drops: u64,
    /// REQs and LAPs dropped because the alternate path they carry found no room in the
    /// path table (fixed-room mode: the room made at PASSIVE_LEVEL was used up); their
    /// senders retry, and the owner is asked for passive work (`wants_room`).
    pub path_room_drops: u64,
    /// REJ, APR and SIDR_REP MADs whose length field (RejectedInfoLength,
    /// AdditionalInfoLength) exceeded 72: handled with it clamped to 72, never dropped.
    pub clamped_lengths: u64,
    /// Messages that named a connection by its comm IDs but came from an address the
    /// connection does not use (src/manager/peer.rs): dropped as forged.
    pub forged: u64,
}

/// The counter slot of an attribute.
pub fn slot(attribute: AttributeId) -> Option<usize> {
    match attribute {
        AttributeId::ClassPortInfo => Some(11),
        other => {
            let id = u16::from(other);
            (0x10..=0x1A).contains(&id).then(|| usize::from(id - 0x10))
        }
    }
}

impl Counters {
    pub(crate) fn bump(table: &mut [u64; COUNTED_ATTRIBUTES], attribute: AttributeId) {
        if let Some(c) = slot(attribute).and_then(|i| table.get_mut(i)) {
            *c += 1;
        }
    }
}
