//! A driver/host node (the portable driver on the host platform: dispatch layer, engine,
//! verifier ledger) as the binding's peer: its MADs reach the binding through the
//! simulated AL's receive path, the binding's MADs addressed to its LID reach it, and its
//! timer and PASSIVE_LEVEL work run, all on a pump thread in real time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ibcm_cep::{CmConfig, MadAddress};
use ibcm_host::{Clock, Node, Wake};
use ibcm_ntos::al;

/// The peer node and its pump.
pub struct Peer {
    pub node: Arc<Node>,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
}

impl Peer {
    /// A node at `address` (CA `ca_guid`) that talks to the binding's port `binding`.
    pub fn start(ca_guid: u64, address: MadAddress, binding: MadAddress) -> Self {
        let clock = Arc::new(Clock::real());
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&ca_guid.to_le_bytes());
        let node = Arc::new(Node::new(
            CmConfig::new(ca_guid, seed),
            address,
            Arc::clone(&clock),
            Arc::new(Wake::default()),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, s) = (Arc::clone(&node), Arc::clone(&stop));
        let pump = std::thread::Builder::new()
            .name("peer".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    for w in al::take_sent() {
                        if w.to_lid == n.address.lid {
                            n.receive(&binding, &w.mad);
                        }
                    }
                    let sent = n.platform.take_sent();
                    for t in &sent {
                        al::receive(t.dest.lid, n.address.lid, &t.mad);
                    }
                    n.platform.recycle_sent(sent);
                    if n.platform.timer().is_some_and(|due| due <= clock.now()) {
                        n.fire_timer();
                    }
                    n.run_passive_work();
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
            .ok();
        Self { node, stop, pump }
    }

    /// Stops the pump; the node's rules must all have held.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
        assert_eq!(
            self.node.violations(),
            vec![],
            "the peer node broke no rule"
        );
    }
}
