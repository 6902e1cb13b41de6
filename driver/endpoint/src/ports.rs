//! Host-wide port numbers: one CM ([`crate::Device`]) serves every port of every CA on the
//! host, while the engine and [`ibcm_cep::MadAddress`] name a port with one `u8`. The
//! platform numbers each (CA GUID, CA port) pair it binds with a host port number and
//! translates at its edges (MADs in and out, `ib_qp_mod_t.port_num`).
//!
//! A number is never given to another pair while the CM lives: a connection still naming
//! a port whose CA went away must not reach another CA's port with the same number. A pair
//! that comes back (the port went down and up, the CA was restarted) gets its number
//! again.

/// Host ports at most: 32 CAs of two ports (WinOF's bus names CAs by GUID, with no limit;
/// a host with more fails the extra ports' binding, and logs it).
pub const MAX_HOST_PORTS: usize = 64;

/// One numbered pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ca_guid: u64,
    ca_port: u8,
    active: bool,
}

/// The numbering (under the platform's lock; no allocation: a fixed table).
#[derive(Debug, Clone)]
pub struct PortNumbers {
    entries: [Option<Entry>; MAX_HOST_PORTS],
}

impl Default for PortNumbers {
    fn default() -> Self {
        Self::new()
    }
}

impl PortNumbers {
    /// No port numbered.
    pub const fn new() -> Self {
        Self {
            entries: [None; MAX_HOST_PORTS],
        }
    }

    /// The host port number of `(ca_guid, ca_port)`, now active: its earlier number if it
    /// had one, else the next free one (1-based, as IB port numbers). `None` when the
    /// table is full or `ca_port` is 0 (not a CA port).
    pub fn assign(&mut self, ca_guid: u64, ca_port: u8) -> Option<u8> {
        if ca_port == 0 {
            return None;
        }
        let mut free = None;
        for (i, e) in self.entries.iter_mut().enumerate() {
            match e {
                Some(e) if e.ca_guid == ca_guid && e.ca_port == ca_port => {
                    e.active = true;
                    return number(i);
                }
                None if free.is_none() => free = Some(i),
                _ => {}
            }
        }
        let i = free?;
        let slot = self.entries.get_mut(i)?;
        *slot = Some(Entry {
            ca_guid,
            ca_port,
            active: true,
        });
        number(i)
    }

    /// The port went away: its number translates no more (it stays reserved for it).
    pub fn deactivate(&mut self, host_port: u8) {
        if let Some(Some(e)) = slot(host_port).and_then(|i| self.entries.get_mut(i)) {
            e.active = false;
        }
    }

    /// The active (CA GUID, CA port) behind a host port number.
    pub fn ca_port(&self, host_port: u8) -> Option<(u64, u8)> {
        let e = self.entries.get(slot(host_port)?)?.as_ref()?;
        e.active.then_some((e.ca_guid, e.ca_port))
    }

    /// The active host port number of `(ca_guid, ca_port)`.
    pub fn host_port(&self, ca_guid: u64, ca_port: u8) -> Option<u8> {
        self.entries.iter().enumerate().find_map(|(i, e)| match e {
            Some(e) if e.active && e.ca_guid == ca_guid && e.ca_port == ca_port => number(i),
            _ => None,
        })
    }

    /// Active ports.
    pub fn active(&self) -> usize {
        self.entries.iter().flatten().filter(|e| e.active).count()
    }
}

fn number(index: usize) -> Option<u8> {
    u8::try_from(index + 1).ok()
}

fn slot(host_port: u8) -> Option<usize> {
    usize::from(host_port).checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cas_get_distinct_numbers() {
        let mut p = PortNumbers::new();
        assert_eq!(p.assign(0xA, 1), Some(1));
        assert_eq!(p.assign(0xA, 2), Some(2));
        assert_eq!(p.assign(0xB, 1), Some(3));
        assert_eq!(p.ca_port(3), Some((0xB, 1)));
        assert_eq!(p.host_port(0xA, 2), Some(2));
        assert_eq!(p.active(), 3);
    }

    #[test]
    fn a_number_is_never_reused_by_another_pair() {
        let mut p = PortNumbers::new();
        assert_eq!(p.assign(0xA, 1), Some(1));
        p.deactivate(1);
        assert_eq!(p.ca_port(1), None);
        assert_eq!(p.host_port(0xA, 1), None);
        assert_eq!(p.assign(0xB, 1), Some(2), "not the departed port's number");
        assert_eq!(
            p.assign(0xA, 1),
            Some(1),
            "the returning pair gets its own back"
        );
        assert_eq!(p.ca_port(1), Some((0xA, 1)));
    }

    #[test]
    fn bounds() {
        let mut p = PortNumbers::new();
        assert_eq!(p.assign(1, 0), None);
        for i in 0..MAX_HOST_PORTS as u64 {
            assert!(p.assign(i, 1).is_some());
        }
        assert_eq!(p.assign(999, 1), None);
        assert_eq!(p.ca_port(0), None);
        assert_eq!(p.ca_port(255), None);
        p.deactivate(0);
        p.deactivate(200);
        assert_eq!(p.active(), MAX_HOST_PORTS);
    }
}
