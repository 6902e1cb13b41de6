//! One port, two CMs: ibcm's engine beside a stand-in for WinOF AL's CM, as on a stock
//! WinOF host (issue #19). There AL's CM receives every CM MAD on QP1, and ibcm takes only
//! what its engine's [`CmManager::owner_of`](ibcm_cep::CmManager::owner_of) calls its own
//! (a REQ or SIDR_REQ a listen of ibcm's takes or a peer-to-peer REQ of ibcm's waits for,
//! every SIDR_REP, any other connection message whose RemoteCommID is in ibcm's comm ID
//! space); the rest stays AL's.
//!
//! Here both CMs are host nodes at one address. Every MAD received for the address goes
//! through [`SharedPort::receive`], which asks ibcm's engine (the one steering decision,
//! not a copy of it) and hands the MAD to ibcm or to the stand-in, counting per CM
//! attribute what was steered to ibcm and what was passed to AL. Both nodes send through
//! the port as they are: whoever carries the port (the simulated fabric, the RoCEv2 port)
//! drains both outboxes and fires both timers.
//!
//! The two comm ID spaces never meet: ibcm's IDs carry [`CmConfig::BESIDE_WINOF_AL`]
//! (wire byte 2 >= 0xF0), the stand-in's [`AL_STAND_IN`] (wire byte 2 <= 0x0F), checked
//! when this file is compiled.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ibcm_cep::{COUNTED_ATTRIBUTES, CmConfig, MadAddress, MadOwner, counter_slot};
use ibcm_mad::{AttributeId, Mad};

use crate::clock::Clock;
use crate::node::Node;
use crate::wake::Wake;

/// `(comm_id_mask, comm_id_value)` of the AL stand-in: wire byte 2's high nibble 0, so
/// wire byte 2 <= 0x0F. AL copies its host-order `cid | modifier << 24` to the wire raw
/// (`al_cm_cep.c` `__get_lcid`; see [`CmConfig::BESIDE_WINOF_AL`]): on x64 wire byte 2 is
/// bits 23..16 of its 24-bit vector index, 0x0F at most below 2^20 live AL CEPs. The
/// stand-in's IDs are what AL's look like on a host with fewer.
pub const AL_STAND_IN: (u32, u32) = (0x0000_F000, 0x0000_0000);

// Two patterns are disjoint when a bit fixed in both is fixed to different values: no
// comm ID of one can be a local comm ID of the other (and `owner_of` calls none of the
// stand-in's ibcm's).
const _: () = {
    let (ibcm_mask, ibcm_value) = CmConfig::BESIDE_WINOF_AL;
    let (al_mask, al_value) = AL_STAND_IN;
    assert!((ibcm_value ^ al_value) & ibcm_mask & al_mask != 0);
};

/// Rows of [`SteerCounts`]: the engine's counter slots (REQ..APR at attribute ID - 0x10,
/// ClassPortInfo at 11), then every other attribute.
pub const STEER_ROWS: usize = COUNTED_ATTRIBUTES + 1;

/// What a shared port did with the MADs it received, by row ([`STEER_ROWS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SteerCounts {
    /// Handed to ibcm's engine ([`MadOwner::Ours`]).
    pub steered: [u64; STEER_ROWS],
    /// Left to AL's CM ([`MadOwner::Theirs`]).
    pub passed: [u64; STEER_ROWS],
}

impl SteerCounts {
    /// The row of an attribute ID.
    pub fn row(attribute: u16) -> usize {
        counter_slot(AttributeId::from(attribute)).unwrap_or(COUNTED_ATTRIBUTES)
    }
}

/// Two CMs on one port: ibcm's engine and the stand-in for AL's, at one address.
pub struct SharedPort {
    ibcm: Arc<Node>,
    al: Arc<Node>,
    steered: [AtomicU64; STEER_ROWS],
    passed: [AtomicU64; STEER_ROWS],
}

impl SharedPort {
    /// The two CMs of a port at `address`: ibcm's with `config` and comm IDs beside AL's
    /// ([`CmConfig::BESIDE_WINOF_AL`]), and AL's stand-in on the same CA (its GUID), with
    /// another RNG seed (TIDs, PSNs and comm ID operand of its own) and comm IDs in
    /// [`AL_STAND_IN`].
    pub fn new(config: CmConfig, address: MadAddress, clock: Arc<Clock>, wake: Arc<Wake>) -> Self {
        let mut al_seed = config.rng_seed;
        for b in &mut al_seed {
            *b ^= 0xA1;
        }
        let al_config = CmConfig {
            rng_seed: al_seed,
            ..config
        }
        .with_comm_id_pattern(AL_STAND_IN);
        let ibcm_config = config.with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL);
        Self {
            ibcm: Arc::new(Node::new(
                ibcm_config,
                address,
                Arc::clone(&clock),
                Arc::clone(&wake),
            )),
            al: Arc::new(Node::new(al_config, address, clock, wake)),
            steered: [const { AtomicU64::new(0) }; STEER_ROWS],
            passed: [const { AtomicU64::new(0) }; STEER_ROWS],
        }
    }

    /// ibcm's node.
    pub fn ibcm(&self) -> &Arc<Node> {
        &self.ibcm
    }

    /// The AL stand-in's node.
    pub fn al(&self) -> &Arc<Node> {
        &self.al
    }

    /// Both nodes, ibcm's first: what sends through the port.
    pub fn nodes(&self) -> [&Arc<Node>; 2] {
        [&self.ibcm, &self.al]
    }

    /// A MAD arrives from `src` (DISPATCH_LEVEL): ibcm's engine decides whose it is, and
    /// the owner receives it.
    pub fn receive(&self, src: &MadAddress, mad: &[u8]) {
        let owner = self.ibcm.owner_of(src.port, mad);
        let attribute = Mad::new_unchecked(mad).attribute_id();
        let (node, counts, to) = match owner {
            MadOwner::Ours => (&self.ibcm, &self.steered, "ibcm"),
            MadOwner::Theirs => (&self.al, &self.passed, "AL"),
        };
        if let Some(c) = counts.get(SteerCounts::row(attribute)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        tracing::trace!(
            target: "ibcm::steer",
            attribute = format_args!("{attribute:#06x}"),
            to,
            "QP1 MAD steered"
        );
        node.receive(src, mad);
    }

    /// What was steered and passed so far.
    pub fn counts(&self) -> SteerCounts {
        let load = |t: &[AtomicU64; STEER_ROWS]| {
            let mut out = [0u64; STEER_ROWS];
            for (o, c) in out.iter_mut().zip(t) {
                *o = c.load(Ordering::Relaxed);
            }
            out
        };
        SteerCounts {
            steered: load(&self.steered),
            passed: load(&self.passed),
        }
    }
}
