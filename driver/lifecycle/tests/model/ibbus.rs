//! ibbus (WinOF `core/bus/kernel/bus_pnp.c` and `core/complib/kernel/cl_pnp_po.c`,
//! lucasz93/WinOFED @913bc0ce) and AL's CA (`core/al/al_common.c`), for one HCA: who waits
//! for what, and what AL does to objects left on a CA that goes.

/// One HCA's ibbus FDO and the AL CA it registers.
#[derive(Debug, Default)]
pub struct Ibbus {
    /// `p_ext->ca_registered`: `__register_ca` ran (bus_pnp.c:433-488).
    pub ca_registered: bool,
    /// ibcm's references on ibbus's interfaces (`n_ifc_ref`, incremented per query by
    /// `al_ref_ifc`, bus_pnp.c:1061-1080, decremented by `al_deref_ifc`, :1085-1105).
    pub ibcm_refs: u32,
    /// The verbs-hook slot whose thunks are in ibbus's copy of the verbs table (the query
    /// goes through ibcm's filter: `__get_ifc`, `IoGetAttachedDeviceReference`, :359-429, :378).
    pub table_patched_by: Option<usize>,
    /// ibcm's AL objects on this CA (AL handle's CA, PD, PnP registration, per port a QP1
    /// alias and a MAD service), by count.
    pub ibcm_al_objects: u32,
    /// AL destroyed ibcm's objects by force when the CA went with them still open
    /// (al_common.c:610-660: "Forcing object destruction", `ref_cnt = 0`).
    pub forced: bool,
    /// ibbus waited with ibcm's reference held: the release build waits without a timeout
    /// (bus_pnp.c:792-801: `p_timemout` is NULL unless `_DEBUG_`), so the power IRP never
    /// completes (bugcheck 0x9F) or PnP hangs.
    pub hung: Option<&'static str>,
    /// `last_pnp_state` of `cl_pnp_po.c`: stopped or surprise removed (fdo_remove_device
    /// then does not stop again, bus_pnp.c:320-324).
    pub released: bool,
}

impl Ibbus {
    /// `__register_ca` (bus_pnp.c:433-488): the verbs query through the top of the stack
    /// (ibcm's filter sets its completion routine when it holds a hook slot), then
    /// `ib_register_ca` (AL's CA; AL's special-QP service creates QP1 through the table).
    pub fn register_ca(&mut self, hook_slot: Option<usize>) {
        self.table_patched_by = hook_slot;
        self.ca_registered = true;
        self.released = false;
    }

    /// `__wait_for_clients_to_exit` (bus_pnp.c:790-829) then `__deregister_ca`
    /// (:753-787, `ib_deregister_ca` :771): `ib_deregister_ca` destroys AL's CA and what is left on it (AL forces
    /// the destruction of objects still referenced after its timeout, al_common.c:610-660),
    /// then the verbs interface is released (ibbus's copy of the table is dead).
    fn wait_and_deregister(&mut self, why: &'static str) -> Result<(), &'static str> {
        if self.ibcm_refs > 0 {
            self.hung = Some(why);
            return Err(why);
        }
        if self.ibcm_al_objects > 0 {
            self.forced = true;
        }
        self.ca_registered = false;
        self.table_patched_by = None;
        Ok(())
    }

    /// `__device_power_down_workItem` (bus_pnp.c:1853-1918): for D3 of a shutdown
    /// (`ShutdownType > PowerActionHibernate`, :1891-1896) pass down; for sleep or
    /// hibernation wait (:1899) and deregister (:1911); then the IRP goes down (:1919).
    pub fn power_down(&mut self, shutdown: bool) -> Result<(), &'static str> {
        if shutdown {
            return Ok(());
        }
        self.wait_and_deregister("D3 for sleep/hibernate (bus_pnp.c:1899)")
    }

    /// `__device_power_up_completion_workItem` (bus_pnp.c:1690-1767): `__register_ca`
    /// (:1721) before the D0 IRP is completed (:1764-1765).
    pub fn power_up(&mut self, hook_slot: Option<usize>) {
        self.register_ca(hook_slot);
    }

    /// `fdo_start` (bus_pnp.c:491, `cl_do_sync_pnp` :514): the start IRP is handled on the way up
    /// (`cl_do_sync_pnp`), then `__register_ca` (:566).
    pub fn start(&mut self, hook_slot: Option<usize>) {
        self.register_ca(hook_slot);
    }

    /// IRP_MN_STOP_DEVICE: `__stop` (cl_pnp_po.c:536-560) calls `pfn_release_resources` (:555-556)
    /// = `fdo_stop_device` (bus_pnp.c:836): wait (:896), deregister (:911).
    pub fn stop(&mut self) -> Result<(), &'static str> {
        self.wait_and_deregister("IRP_MN_STOP_DEVICE (cl_pnp_po.c:556, bus_pnp.c:896)")?;
        self.released = true;
        Ok(())
    }

    /// IRP_MN_SURPRISE_REMOVAL: `__surprise_remove` (cl_pnp_po.c:759-786) calls
    /// `fdo_stop_device` unless already stopped (:778-782).
    pub fn surprise_remove(&mut self) -> Result<(), &'static str> {
        if !self.released {
            self.wait_and_deregister("IRP_MN_SURPRISE_REMOVAL (cl_pnp_po.c:781, bus_pnp.c:896)")?;
        }
        self.released = true;
        Ok(())
    }

    /// IRP_MN_REMOVE_DEVICE: `fdo_remove_device` (bus_pnp.c:296-353) stops the device
    /// unless it was surprise removed or stopped (:320-324, the IRP goes down at :339).
    pub fn remove(&mut self) -> Result<(), &'static str> {
        if !self.released {
            self.wait_and_deregister("IRP_MN_REMOVE_DEVICE (bus_pnp.c:323, :896)")?;
        }
        self.released = true;
        Ok(())
    }
}
