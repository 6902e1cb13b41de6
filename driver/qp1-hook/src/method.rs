//! The method byte: which received MADs the hook may remap, the remap itself, and its
//! undoing in ibcm's MAD-service receive callback.
//!
//! AL's GSI dispatcher routes an unsolicited MAD by (class version, class, method)
//! (`core/al/al_mad.c`: `__mad_disp_recv_done`), and AL's CM holds (2, 0x07, Send)
//! (`core/al/kernel/al_cm_cep.c`: `__init_data_svc`). A CM MAD of ibcm's whose method byte
//! reads a private method `M` instead reaches the MAD service ibcm registered for `{M, Get}`
//! on a QP1 alias; ibcm puts Send back before it parses the MAD.

/// Bytes in front of the MAD in a QP1 receive buffer: the GRH, present or not (IBA
/// 11.4.1.2: a UD receive places the GRH, or 40 undefined bytes, first; WinOF's MAD
/// element posts GRH + MAD as one segment, `core/al/kernel/al_mad_pool.c`: `grh_ds`).
pub const GRH_SIZE: usize = 40;
/// A MAD (IBA 13.4.1).
pub const MAD_SIZE: usize = 256;
/// A QP1 receive: GRH + MAD (WinOF `MAD_BLOCK_GRH_SIZE`).
pub const RECEIVE_SIZE: usize = GRH_SIZE + MAD_SIZE;
/// The common MAD header (IBA 13.4.3, Table 137): the part a [`Ticket`](crate::Ticket)
/// remembers.
pub const MAD_HEADER_SIZE: usize = 24;

/// BaseVersion is MAD byte 0, then MgmtClass, ClassVersion and Method (byte 3): IBA
/// 13.4.3, Table 137.
const BASE_VERSION: usize = 0;
const METHOD: usize = 3;
/// BaseVersion of every MAD (IBA 13.4.3).
const MAD_BASE_VERSION: u8 = 1;
/// The Communication Management class (IBA 13.4.4, Table 138) and its version since IBA
/// 1.2 (IBA 12.6.1).
const CM_CLASS: u8 = 0x07;
const CM_CLASS_VERSION: u8 = 2;
/// Get and Send, the CM class's methods (IBA 13.4.5, Table 140; IBA 12.6.1).
const GET: u8 = 0x01;
const SEND: u8 = 0x03;
/// TrapRepress: AL reads it as a response (`inc/iba/ib_types.h`: `ib_mad_is_response`).
const TRAP_REPRESS: u8 = 0x07;
/// Methods AL's dispatcher can register: 1..MAX_METHOD (`core/al/al_mad.c`: `MAX_METHOD`
/// 127, `__mad_disp_reg_unsol` checks `method_array[1..127)`).
const MAX_METHOD: u8 = 127;

/// The private method ibcm's CM MADs carry between the hook and ibcm's receive callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateMethod(u8);

impl PrivateMethod {
    /// The method ibcm uses unless told otherwise: the highest AL registers, no method
    /// IBA defines for any class (IBA 13.4.5, Table 140 stops at 0x15).
    pub const DEFAULT: Self = Self(MAX_METHOD - 1);

    /// `method` as a private method: 1..=126, not a response (no 0x80 bit, not
    /// TrapRepress), and neither of the CM class's own methods (Get, Send: IBA 12.6.1).
    pub const fn new(method: u8) -> Option<Self> {
        if method == 0
            || method >= MAX_METHOD
            || method == GET
            || method == SEND
            || method == TRAP_REPRESS
        {
            None
        } else {
            Some(Self(method))
        }
    }

    /// The method byte.
    pub const fn get(self) -> u8 {
        self.0
    }
}

/// Whether a received MAD is one the hook asks the steering decision about: a CM MAD
/// (base version 1, class 0x07, version 2) with method Send. Anything else reaches AL's
/// dispatcher as it came.
pub fn is_cm_send(mad: &[u8]) -> bool {
    mad.get(BASE_VERSION..=METHOD) == Some(&[MAD_BASE_VERSION, CM_CLASS, CM_CLASS_VERSION, SEND])
}

/// Rewrites a CM Send's method byte to `method` in place (the hook, inside `poll_cq`,
/// on a MAD the steering decision gave ibcm). Returns false, changing nothing, for a MAD
/// that is not a CM Send.
pub fn remap(mad: &mut [u8], method: PrivateMethod) -> bool {
    if !is_cm_send(mad) {
        return false;
    }
    match mad.get_mut(METHOD) {
        Some(byte) => {
            *byte = method.get();
            true
        }
        None => false,
    }
}

/// What ibcm's MAD-service receive callback does with a MAD AL delivered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// A CM message the hook steered: its method is Send again; parse it.
    Steered,
    /// A ClassPortInfo Get (AL's CM does not hold Get): parse it as it came.
    Get,
}

/// Why ibcm's receive callback drops a MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Shorter than a MAD header, or not class 0x07 version 2.
    NotCm,
    /// Method `M` but not remapped by the hook: sent with that method on the wire.
    NotFromHook,
    /// A method ibcm did not register.
    Method(u8),
}

/// ibcm's MAD-service receive callback, on its copy of a delivered MAD: a MAD with the
/// private method that the hook remapped (`from_hook`: [`Hook::claim`](crate::Hook::claim)
/// found its ticket) gets Send back; a Get passes; everything else is refused, the MAD
/// unchanged.
pub fn restore(
    mad: &mut [u8],
    method: PrivateMethod,
    from_hook: bool,
) -> Result<Delivered, Refused> {
    let Some(&[base, class, version, m]) = mad.get(BASE_VERSION..=METHOD) else {
        return Err(Refused::NotCm);
    };
    if [base, class, version] != [MAD_BASE_VERSION, CM_CLASS, CM_CLASS_VERSION] {
        return Err(Refused::NotCm);
    }
    if m == GET {
        return Ok(Delivered::Get);
    }
    if m != method.get() {
        return Err(Refused::Method(m));
    }
    if !from_hook {
        return Err(Refused::NotFromHook);
    }
    match mad.get_mut(METHOD) {
        Some(byte) => {
            *byte = SEND;
            Ok(Delivered::Steered)
        }
        None => Err(Refused::NotCm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(method: u8) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        mad[..4].copy_from_slice(&[1, 0x07, 2, method]);
        mad
    }

    #[test]
    fn private_methods_are_registrable_requests_the_cm_class_does_not_use() {
        for m in 0..=u8::MAX {
            let ok = PrivateMethod::new(m).is_some();
            let expected = (1..=126).contains(&m) && ![1, 3, 7].contains(&m);
            assert_eq!(ok, expected, "method {m:#x}");
        }
        assert_eq!(PrivateMethod::new(126), Some(PrivateMethod::DEFAULT));
    }

    #[test]
    fn remap_touches_only_the_method_of_a_cm_send_and_restore_undoes_it() {
        let m = PrivateMethod::DEFAULT;
        let mut mad = cm(3);
        mad[4..].fill(0x5A);
        let before = mad;
        assert!(remap(&mut mad, m));
        assert_eq!(mad[3], 126);
        assert_eq!(mad[..3], before[..3]);
        assert_eq!(mad[4..], before[4..]);
        assert_eq!(restore(&mut mad, m, true), Ok(Delivered::Steered));
        assert_eq!(mad, before);
        for other in [cm(1), cm(0x81), cm(126)] {
            let mut copy = other;
            assert!(!remap(&mut copy, m));
            assert_eq!(copy, other);
        }
        let mut sa = cm(3);
        sa[1] = 0x03;
        assert!(!remap(&mut sa, m));
        assert!(!remap(&mut [1, 7, 2], m));
    }

    #[test]
    fn restore_refuses_the_private_method_without_the_hook_and_unregistered_methods() {
        let m = PrivateMethod::DEFAULT;
        let mut spoofed = cm(126);
        assert_eq!(restore(&mut spoofed, m, false), Err(Refused::NotFromHook));
        assert_eq!(spoofed, cm(126));
        assert_eq!(restore(&mut cm(1), m, false), Ok(Delivered::Get));
        assert_eq!(restore(&mut cm(3), m, true), Err(Refused::Method(3)));
        let mut old = cm(126);
        old[2] = 1;
        assert_eq!(restore(&mut old, m, true), Err(Refused::NotCm));
        assert_eq!(restore(&mut [1, 7], m, true), Err(Refused::NotCm));
    }
}
