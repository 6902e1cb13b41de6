//! The host under test: HCAs (each with ibbus, AL's CA and ibcm's filter running
//! [`Hca`]), the verbs-hook slots, the host CM with its connections and kernel-client ids,
//! and the control device. [`World::run`] carries out a lifecycle [`Step`] the way the
//! KMDF binding does (`driver/kmdf/filter.rs`, `ibal.rs`), and every check of issue #27
//! is made on the way: violations are collected, never panicked on, so a test can show
//! the old mapping failing.

use ibcm_lifecycle::{Callback, Hca, Mapping, Step, Teardown, UNBIND};

use super::ibbus::Ibbus;

/// Ports per HCA in the model (ConnectX: two).
pub const PORTS: u8 = 2;
/// Verbs-hook slots (`driver/kmdf/verbs_hook.rs` `MAX_HCAS`).
pub const SLOTS: usize = 8;

/// Who holds a connection or id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A user-mode endpoint (IOCTL file).
    User,
    /// A kernel client's `iba_cm` id (WinVerbs, ndfltr).
    Kernel,
}

/// A connection (or a kernel-client id bound to a port) in the host CM.
#[derive(Clone, Copy, Debug)]
pub struct Connection {
    pub hca: usize,
    pub host_port: u8,
    pub owner: Owner,
    /// DEVICE_REMOVAL delivered (`Device::remove_port` or `Device::remove`).
    pub told: bool,
}

/// One HCA's stack.
#[derive(Debug)]
pub struct Stack {
    pub ibbus: Ibbus,
    pub filter: Option<Hca>,
    pub hook_slot: Option<usize>,
    /// This filter's ports are in the host's port table.
    pub published: bool,
    /// What the binding holds of AL (the model of `FilterIbal::binding`).
    pub al_open: bool,
    pub interface_held: bool,
    /// The slot's steering decision names this filter.
    pub steering: bool,
    /// Counted in the host CM's verdict as bound.
    pub in_verdict: bool,
}

/// The control device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    None,
    Live,
    /// Deleted with the last filter while a user handle was open: the name stays taken
    /// until the handle closes (REVIEW.md §3.1).
    Lingering,
}

#[derive(Debug)]
pub struct World {
    pub mapping: Mapping,
    /// The parts of `Step::Unbind`, in order ([`UNBIND`]; a test may mutate it).
    pub unbind: Vec<Teardown>,
    pub stacks: Vec<Stack>,
    pub slots: [Option<usize>; SLOTS],
    pub filters: usize,
    pub control: Control,
    pub user_handles: u32,
    /// The host CM exists (made with the control device's first port, torn down with
    /// the last filter).
    pub cm: bool,
    pub connections: Vec<Connection>,
    /// Kernel clients' references on ibcm's `iba_cm` (WinVerbs holds one per HCA while its
    /// device is in D0: `wv_driver.c:554`, released in `WvPowerD0Exit`, :662-672).
    pub iba_cm_refs: u32,
    pub violations: Vec<String>,
    /// A wait that never ends: the scenario stops there.
    pub hung: Option<String>,
}

impl World {
    pub fn new(mapping: Mapping, hcas: usize) -> Self {
        Self {
            mapping,
            unbind: UNBIND.to_vec(),
            stacks: (0..hcas)
                .map(|_| Stack {
                    ibbus: Ibbus::default(),
                    filter: None,
                    hook_slot: None,
                    published: false,
                    al_open: false,
                    interface_held: false,
                    steering: false,
                    in_verdict: false,
                })
                .collect(),
            slots: [None; SLOTS],
            filters: 0,
            control: Control::None,
            user_handles: 0,
            cm: false,
            connections: Vec::new(),
            iba_cm_refs: 0,
            violations: Vec::new(),
            hung: None,
        }
    }

    fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    /// `filter::add` (`EvtDriverDeviceAdd`): a hook slot, the filter count, the control
    /// device with the first filter.
    pub fn device_add(&mut self, hca: usize) {
        let slot = self.slots.iter().position(Option::is_none);
        if let Some(s) = slot {
            self.slots[s] = Some(hca);
        }
        self.stacks[hca].hook_slot = slot;
        self.stacks[hca].filter = Some(Hca::added(self.mapping, slot.is_some()));
        if self.filters == 0 {
            self.create_control();
        }
        self.filters += 1;
    }

    fn create_control(&mut self) {
        if self.control != Control::Lingering {
            self.control = Control::Live;
        }
    }

    /// A KMDF callback of `hca`'s filter: the lifecycle's plan, carried out.
    pub fn callback(&mut self, hca: usize, callback: Callback) {
        let Some(filter) = self.stacks[hca].filter.as_mut() else {
            return;
        };
        let plan = filter.on(callback);
        for step in plan {
            self.run(hca, step);
        }
    }

    fn run(&mut self, hca: usize, step: Step) {
        match step {
            Step::EnsureControlDevice => {
                if self.control == Control::None {
                    self.create_control();
                }
            }
            Step::Bind => self.bind(hca),
            Step::Unbind => {
                for teardown in self.unbind.clone() {
                    self.teardown(hca, teardown);
                }
            }
            Step::ReleaseHookSlot => {
                let Some(slot) = self.stacks[hca].hook_slot.take() else {
                    return;
                };
                if self.stacks[hca].ibbus.table_patched_by == Some(slot) {
                    self.violation(format!(
                        "HCA {hca}: hook slot {slot} released while ibbus's table still holds its thunks"
                    ));
                }
                self.slots[slot] = None;
            }
            Step::CountOut => {
                self.filters -= 1;
                if self.filters == 0 {
                    self.teardown_host();
                }
            }
        }
    }

    /// `ibal::bind`: no control device, no binding. `WdfFdoQueryForInterface` succeeds and
    /// takes a reference on ibbus's interface whether or not the CA is registered
    /// (`__query_al_ifc`, bus_pnp.c:1211-1250): a bind before the registration holds
    /// ibbus as a bound HCA does (the AL handle, its CA, PD and PnP registration) but gets
    /// no port, and is a violation (D0Entry comes after the D0 IRP completed below).
    fn bind(&mut self, hca: usize) {
        if self.control != Control::Live {
            return;
        }
        let stack = &mut self.stacks[hca];
        stack.ibbus.ibcm_refs += 1;
        stack.interface_held = true;
        stack.al_open = true;
        if !stack.ibbus.ca_registered {
            stack.ibbus.ibcm_al_objects += 3;
            self.violations
                .push(format!("HCA {hca}: bound while its CA is not registered"));
            return;
        }
        // AL handle's CA, PD, PnP registration, per port an alias and a MAD service.
        stack.ibbus.ibcm_al_objects += 3 + 2 * u32::from(PORTS);
        stack.published = true;
        stack.steering = stack.hook_slot.is_some();
        stack.in_verdict = true;
        self.cm = true;
    }

    fn teardown(&mut self, hca: usize, part: Teardown) {
        match part {
            Teardown::ClearSteering => self.stacks[hca].steering = false,
            Teardown::UnpublishPorts => {
                if self.stacks[hca].published {
                    self.stacks[hca].published = false;
                    for port in self.host_ports(hca) {
                        self.remove_port(port);
                    }
                }
            }
            Teardown::CloseAl => {
                if self.stacks[hca].al_open {
                    self.use_al(hca, "ib_close_al");
                    let stack = &mut self.stacks[hca];
                    stack.al_open = false;
                    stack.ibbus.ibcm_al_objects = 0;
                }
            }
            Teardown::ReleaseInterface => {
                let stack = &mut self.stacks[hca];
                if stack.interface_held {
                    stack.interface_held = false;
                    stack.ibbus.ibcm_refs -= 1;
                }
                stack.in_verdict = false;
            }
        }
    }

    /// ibcm uses one of its AL objects on `hca` (close, send).
    pub fn use_al(&mut self, hca: usize, what: &str) {
        if self.stacks[hca].ibbus.forced {
            self.violation(format!(
                "HCA {hca}: {what} on AL objects AL destroyed by force when the CA went"
            ));
        }
    }

    /// The host port numbers of `hca` (`PortNumbers`: a CA port keeps its number).
    pub fn host_ports(&self, hca: usize) -> Vec<u8> {
        (1..=PORTS)
            .map(|p| u8::try_from(hca).unwrap() * PORTS + p)
            .collect()
    }

    /// `Device::remove_port`: DEVICE_REMOVAL to every connection and id on the port.
    fn remove_port(&mut self, port: u8) {
        for c in &mut self.connections {
            if c.host_port == port {
                c.told = true;
            }
        }
    }

    /// The last filter's cleanup: `host::teardown` waits for the kernel clients'
    /// references, then `Device::remove` tells every endpoint left; the control device
    /// goes (lingers while a user handle is open).
    fn teardown_host(&mut self) {
        if self.iba_cm_refs > 0 {
            self.hung = Some(format!(
                "host teardown waits for {} iba_cm references",
                self.iba_cm_refs
            ));
        }
        for c in &mut self.connections {
            c.told = true;
        }
        self.cm = false;
        self.control = if self.user_handles > 0 {
            Control::Lingering
        } else {
            Control::None
        };
    }

    /// The user closes every handle of the control device.
    pub fn close_user_handles(&mut self) {
        self.user_handles = 0;
        if self.control == Control::Lingering {
            self.control = Control::None;
        }
    }

    /// A connection (or kernel id) on each of `hca`'s ports, if they are published.
    pub fn connect(&mut self, hca: usize, owner: Owner) {
        if !self.stacks[hca].published {
            return;
        }
        for host_port in self.host_ports(hca) {
            self.connections.push(Connection {
                hca,
                host_port,
                owner,
                told: false,
            });
        }
    }

    /// A send on every published port (the send path uses the port's AL objects).
    pub fn send_everywhere(&mut self) {
        for hca in 0..self.stacks.len() {
            if self.stacks[hca].published {
                self.use_al(hca, "ib_send_mad");
            }
        }
    }

    /// The checks that hold between any two transitions.
    pub fn check(&mut self) {
        for hca in 0..self.stacks.len() {
            let stack = &self.stacks[hca];
            let (published, registered) = (stack.published, stack.ibbus.ca_registered);
            let (steering, al_open) = (stack.steering, stack.al_open);
            if published && !registered {
                let what = format!("HCA {hca}: ports published while its CA is deregistered");
                self.violation(what);
            }
            if steering && !al_open {
                let what = format!("HCA {hca}: steering set without its MAD services");
                self.violation(what);
            }
            let untold: Vec<u8> = self
                .connections
                .iter()
                .filter(|c| c.hca == hca && !c.told && !self.stacks[hca].published)
                .map(|c| c.host_port)
                .collect();
            if !untold.is_empty() {
                let what =
                    format!("HCA {hca}: connections on ports {untold:?} not told their ports went");
                self.violation(what);
            }
        }
    }

    /// After every HCA is gone: nothing held, nothing untold.
    pub fn check_nothing_left(&mut self) {
        for hca in 0..self.stacks.len() {
            let s = &self.stacks[hca];
            if s.ibbus.ibcm_refs > 0 || s.ibbus.ibcm_al_objects > 0 || s.hook_slot.is_some() {
                let what = format!(
                    "HCA {hca}: leaked {:?}",
                    (s.ibbus.ibcm_refs, s.ibbus.ibcm_al_objects, s.hook_slot)
                );
                self.violation(what);
            }
        }
        if self.slots.iter().any(Option::is_some) || self.filters != 0 || self.cm {
            let what = format!(
                "host leaked: slots {:?}, filters {}, cm {}",
                self.slots, self.filters, self.cm
            );
            self.violation(what);
        }
        if self.connections.iter().any(|c| !c.told) {
            self.violation("a connection was never told".into());
        }
    }
}
