//! ClassPortInfo (IBA 13.4.8.1, Table 146) as the CM class reports it.

use crate::D;
use crate::error::{Error, check_width};
use crate::path::Gid;
use crate::view::view;

/// ClassPortInfo occupies the first 72 bytes of the CM data.
pub const CLASS_PORT_INFO_SIZE: usize = 72;

view! {
    /// A zero-copy view of a ClassPortInfo MAD.
    pub struct ClassPortInfoPacket [base D, len 232] {
        /// BaseVersion supported.
        base_version / set_base_version: u8(0);
        /// ClassVersion supported.
        class_version / set_class_version: u8(1);
        /// CapabilityMask.
        capability_mask / set_capability_mask: u16(2);
        /// CapabilityMask2 (27 bits) and RespTimeValue (5 bits), as one word.
        cap_mask2_resp_time / set_cap_mask2_resp_time: u32(4);
        /// RedirectGID.
        redirect_gid / set_redirect_gid: gid(8);
        /// RedirectTC (8), RedirectSL (4), RedirectFL (20), as one word.
        redirect_tc_sl_fl / set_redirect_tc_sl_fl: u32(24);
        /// RedirectLID.
        redirect_lid / set_redirect_lid: u16(28);
        /// RedirectP_Key.
        redirect_pkey / set_redirect_pkey: u16(30);
        /// RedirectQP (24 bits after a reserved byte).
        redirect_qp / set_redirect_qp: u24(33);
        /// RedirectQ_Key.
        redirect_qkey / set_redirect_qkey: u32(36);
        /// TrapGID.
        trap_gid / set_trap_gid: gid(40);
        /// TrapTC (8), TrapSL (4), TrapFL (20), as one word.
        trap_tc_sl_fl / set_trap_tc_sl_fl: u32(56);
        /// TrapLID.
        trap_lid / set_trap_lid: u16(60);
        /// TrapP_Key.
        trap_pkey / set_trap_pkey: u16(62);
        /// TrapHL.
        trap_hop_limit / set_trap_hop_limit: u8(64);
        /// TrapQP (24 bits).
        trap_qp / set_trap_qp: u24(65);
        /// TrapQ_Key.
        trap_qkey / set_trap_qkey: u32(68);
    }
}

/// Where a redirect or a trap goes: GID, TC/SL/flow label, LID, P_Key, QP, Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpiTarget {
    /// GID.
    pub gid: Gid,
    /// Traffic class.
    pub traffic_class: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// LID.
    pub lid: u16,
    /// P_Key.
    pub pkey: u16,
    /// QP (24 bits).
    pub qp: u32,
    /// Q_Key.
    pub qkey: u32,
}

impl CpiTarget {
    fn tc_sl_fl(&self) -> u32 {
        (u32::from(self.traffic_class) << 24) | (u32::from(self.sl) << 20) | self.flow_label
    }

    fn check(&self) -> Result<(), Error> {
        check_width("SL", self.sl.into(), 4)?;
        check_width("FL", self.flow_label.into(), 20)?;
        check_width("QP", self.qp.into(), 24)
    }
}

fn split_tc_sl_fl(word: u32) -> (u8, u8, u32) {
    let [tc, sl_fl, ..] = word.to_be_bytes();
    (tc, sl_fl >> 4, word & 0xf_ffff)
}

/// ClassPortInfo: the class's capabilities, response time and redirect/trap targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassPortInfo {
    /// BaseVersion supported.
    pub base_version: u8,
    /// ClassVersion supported.
    pub class_version: u8,
    /// CapabilityMask.
    pub capability_mask: u16,
    /// CapabilityMask2 (27 bits).
    pub capability_mask2: u32,
    /// RespTimeValue (5 bits, IB time).
    pub resp_time_value: u8,
    /// Redirect target.
    pub redirect: CpiTarget,
    /// Trap target; its hop limit is TrapHL.
    pub trap: CpiTarget,
    /// TrapHL.
    pub trap_hop_limit: u8,
}

impl ClassPortInfo {
    /// Reads ClassPortInfo from a MAD buffer.
    pub fn parse(buf: &[u8]) -> Result<Self, Error> {
        let p = ClassPortInfoPacket::new_checked(buf)?;
        let word = p.cap_mask2_resp_time();
        let (rtc, rsl, rfl) = split_tc_sl_fl(p.redirect_tc_sl_fl());
        let (ttc, tsl, tfl) = split_tc_sl_fl(p.trap_tc_sl_fl());
        Ok(Self {
            base_version: p.base_version(),
            class_version: p.class_version(),
            capability_mask: p.capability_mask(),
            capability_mask2: word >> 5,
            resp_time_value: (word & 0x1f) as u8,
            redirect: CpiTarget {
                gid: p.redirect_gid(),
                traffic_class: rtc,
                sl: rsl,
                flow_label: rfl,
                lid: p.redirect_lid(),
                pkey: p.redirect_pkey(),
                qp: p.redirect_qp(),
                qkey: p.redirect_qkey(),
            },
            trap: CpiTarget {
                gid: p.trap_gid(),
                traffic_class: ttc,
                sl: tsl,
                flow_label: tfl,
                lid: p.trap_lid(),
                pkey: p.trap_pkey(),
                qp: p.trap_qp(),
                qkey: p.trap_qkey(),
            },
            trap_hop_limit: p.trap_hop_limit(),
        })
    }

    /// Checks field widths.
    pub fn check(&self) -> Result<(), Error> {
        check_width("CapabilityMask2", self.capability_mask2.into(), 27)?;
        check_width("RespTimeValue", self.resp_time_value.into(), 5)?;
        self.redirect.check()?;
        self.trap.check()
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = ClassPortInfoPacket::new_unchecked(buf);
        p.set_base_version(self.base_version);
        p.set_class_version(self.class_version);
        p.set_capability_mask(self.capability_mask);
        p.set_cap_mask2_resp_time((self.capability_mask2 << 5) | u32::from(self.resp_time_value));
        p.set_redirect_gid(self.redirect.gid);
        p.set_redirect_tc_sl_fl(self.redirect.tc_sl_fl());
        p.set_redirect_lid(self.redirect.lid);
        p.set_redirect_pkey(self.redirect.pkey);
        p.set_redirect_qp(self.redirect.qp);
        p.set_redirect_qkey(self.redirect.qkey);
        p.set_trap_gid(self.trap.gid);
        p.set_trap_tc_sl_fl(self.trap.tc_sl_fl());
        p.set_trap_lid(self.trap.lid);
        p.set_trap_pkey(self.trap.pkey);
        p.set_trap_hop_limit(self.trap_hop_limit);
        p.set_trap_qp(self.trap.qp);
        p.set_trap_qkey(self.trap.qkey);
    }
}
