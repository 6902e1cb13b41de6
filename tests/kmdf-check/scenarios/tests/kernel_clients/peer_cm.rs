//! The peer node's own `iba_cm` (the portable instance on the host platform, as
//! driver/iba-cm/ctest's harness makes it), for a kernel client on the peer's side of a
//! connection with the binding. Its deferred deliveries run when the test pumps them
//! ([`PeerCm::deliver`]), at the peer's DISPATCH_LEVEL (its verifier ledger).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ibcm_endpoint::Device;
use ibcm_host::verifier::{at_dispatch, is_at_dispatch};
use ibcm_host::{HostPlatform, Node};
use ibcm_iba_cm::abi::InfinibandInterfaceCm;
use ibcm_iba_cm::{Backend, Config, Registered};

use super::endpoints::Host as Client;

/// The peer CM's room: ids, listens, backlog, concurrency (as ctest's harness).
const CONFIG: Config = Config {
    ids: 32,
    listens: 4,
    backlog: 8,
    concurrency: 16,
};

/// The peer node's backend of the `iba_cm` instance.
pub struct PeerBackend {
    node: Arc<Node>,
    ca_guid: u64,
    pending: AtomicBool,
}

impl Backend for PeerBackend {
    type Platform = HostPlatform;

    fn device(&self) -> &Device<HostPlatform> {
        &self.node.device
    }

    fn at_dispatch(&self, f: &mut dyn FnMut()) {
        at_dispatch(&self.node.platform.ledger, f);
    }

    fn at_passive(&self) -> bool {
        !is_at_dispatch()
    }

    fn schedule_delivery(&self) {
        self.pending.store(true, Ordering::Release);
    }

    fn port_of_gid(&self, gid: &[u8; 16]) -> Option<u8> {
        (*gid == self.node.address.gid).then_some(1)
    }

    fn pkey_index(&self, _port: u8, pkey: u16) -> u16 {
        // The default partition at index 0, as a subnet manager sets it.
        if pkey | 0x8000 == 0xFFFF { 0 } else { 1 }
    }

    fn ca_guid(&self) -> u64 {
        self.ca_guid
    }
}

/// The peer's CM, its table as a client got it, and that client's hooks.
pub struct PeerCm {
    cm: Registered<PeerBackend>,
    table: Box<InfinibandInterfaceCm>,
    pub client: Arc<Client>,
}

impl PeerCm {
    pub fn new(node: &Arc<Node>, ca_guid: u64) -> Self {
        let backend = PeerBackend {
            node: Arc::clone(node),
            ca_guid,
            pending: AtomicBool::new(false),
        };
        let cm = Registered::new(backend, CONFIG).expect("the peer's iba_cm instance");
        let table = Box::new(cm.answer_query(0x0101, 208).expect("the interface"));
        let client = Arc::new(Client::on_ledger(
            &raw const *table,
            Arc::clone(&node.platform.ledger),
        ));
        Self { cm, table, client }
    }

    /// The deferred deliveries (the peer's DPC).
    pub fn deliver(&self) {
        let backend = self.cm.backend();
        if backend.pending.swap(false, Ordering::AcqRel) {
            at_dispatch(&backend.node.platform.ledger, || self.cm.deliver());
        }
    }

    /// The client's reference goes, then the CM.
    pub fn remove(self) {
        drop(self.client);
        super::release_cm_interface(&self.table);
        drop(self.cm);
    }
}
