//! RDMA-CM interoperability (IBA Vol 1 Annex A11, "RDMA IP CM Service"): the IP addressing
//! header at the start of REQ private data, and the service IDs of the IP port spaces.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::enums::enum_with_unknown;

/// The IP addressing header takes the first 36 bytes of the REQ private data, leaving 56.
pub const IP_HEADER_SIZE: usize = 36;
/// MajMinVer of Annex A11 version 0.0.
pub const IP_HEADER_VERSION: u8 = 0x00;

enum_with_unknown! {
    /// RDMA-CM port spaces with the Annex A11 prefix (Linux `enum rdma_ucm_port_space`).
    pub enum PortSpace(u16) {
        /// TCP port space (IP protocol 6): RC connections.
        Tcp = 0x0106,
        /// UDP port space (IP protocol 17): UD, resolved with SIDR.
        Udp = 0x0111,
        /// The native IB port space.
        Ib = 0x013F,
    }
}

/// An Annex A11 service ID: 0x0000000001 in bits 63..24, then the port space's protocol
/// byte and the 16-bit port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpServiceId {
    /// The port space.
    pub port_space: PortSpace,
    /// The port.
    pub port: u16,
}

impl IpServiceId {
    /// The TCP port-space service ID for `port`.
    pub const fn tcp(port: u16) -> Self {
        Self {
            port_space: PortSpace::Tcp,
            port,
        }
    }

    /// The 64-bit ServiceID; a port space without the 0x01 prefix byte is emitted as is.
    pub fn to_service_id(self) -> u64 {
        (u64::from(u16::from(self.port_space)) << 16) | u64::from(self.port)
    }

    /// Recognises a ServiceID of the Annex A11 form.
    pub fn from_service_id(service_id: u64) -> Option<Self> {
        if service_id >> 24 != 0x01 {
            return None;
        }
        Some(Self {
            port_space: PortSpace::from((service_id >> 16) as u16),
            port: service_id as u16,
        })
    }

    /// The mask that selects a whole port space of service IDs (for a listen).
    pub const PORT_SPACE_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
}

/// The IP addressing header that RDMA-CM puts at the start of REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpHeader {
    /// The active side's source port.
    pub src_port: u16,
    /// The active side's address.
    pub src_addr: IpAddr,
    /// The address the active side connects to.
    pub dst_addr: IpAddr,
}

impl IpHeader {
    /// Reads the header from the start of REQ private data.
    pub fn parse(private_data: &[u8]) -> Result<Self, IpHeaderError> {
        let Some(&[version, ip_version, port_hi, port_lo, ref addrs @ ..]) =
            private_data.first_chunk::<IP_HEADER_SIZE>()
        else {
            return Err(IpHeaderError::Truncated {
                len: private_data.len(),
            });
        };
        if version != IP_HEADER_VERSION {
            return Err(IpHeaderError::Version(version));
        }
        let (src, dst) = split_addresses(addrs);
        let (src_addr, dst_addr) = match ip_version >> 4 {
            4 => (v4(&src), v4(&dst)),
            6 => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
            ),
            other => return Err(IpHeaderError::IpVersion(other)),
        };
        Ok(Self {
            src_port: u16::from_be_bytes([port_hi, port_lo]),
            src_addr,
            dst_addr,
        })
    }

    /// Writes the header to the first 36 bytes of `out`; both addresses must be of one
    /// family. IPv4 addresses go in the last 4 bytes of their 16-byte fields.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), IpHeaderError> {
        let len = out.len();
        let Some(h) = out.first_chunk_mut::<IP_HEADER_SIZE>() else {
            return Err(IpHeaderError::Truncated { len });
        };
        let (ip_version, src, dst) = match (self.src_addr, self.dst_addr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4u8, v4_field(s), v4_field(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6u8, s.octets(), d.octets()),
            _ => return Err(IpHeaderError::FamilyMismatch),
        };
        let [port_hi, port_lo] = self.src_port.to_be_bytes();
        let mut header = [0u8; IP_HEADER_SIZE];
        header[..4].copy_from_slice(&[IP_HEADER_VERSION, ip_version << 4, port_hi, port_lo]);
        header[4..20].copy_from_slice(&src);
        header[20..].copy_from_slice(&dst);
        *h = header;
        Ok(())
    }
}

/// Why an RDMA-CM IP header could not be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpHeaderError {
    /// The private data (or the output) is shorter than the 36-byte header.
    Truncated {
        /// Its length.
        len: usize,
    },
    /// MajMinVer is not 0.0 (Annex A11).
    Version(u8),
    /// IPVersion is neither 4 nor 6.
    IpVersion(u8),
    /// The two addresses are of different families.
    FamilyMismatch,
}

impl core::fmt::Display for IpHeaderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Truncated { len } => {
                write!(
                    f,
                    "RDMA-CM IP header needs {IP_HEADER_SIZE} bytes, got {len}"
                )
            }
            Self::Version(v) => write!(f, "RDMA-CM IP header version {v:#04x}, expected 0"),
            Self::IpVersion(v) => write!(f, "RDMA-CM IP version {v}, expected 4 or 6"),
            Self::FamilyMismatch => {
                f.write_str("RDMA-CM source and destination differ in IP family")
            }
        }
    }
}

impl core::error::Error for IpHeaderError {}

/// The source and destination address fields (16 bytes each) after the first 4 bytes.
fn split_addresses(addrs: &[u8; IP_HEADER_SIZE - 4]) -> ([u8; 16], [u8; 16]) {
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    let (s, d) = addrs.split_at(16);
    src.copy_from_slice(s);
    dst.copy_from_slice(d);
    (src, dst)
}

fn v4(field: &[u8; 16]) -> IpAddr {
    let [.., a, b, c, d] = *field;
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn v4_field(addr: Ipv4Addr) -> [u8; 16] {
    let mut f = [0u8; 16];
    let [a, b, c, d] = addr.octets();
    f[12..].copy_from_slice(&[a, b, c, d]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_service_id_matches_linux_formula() {
        // Linux: ((u64)RDMA_PS_TCP << 16) + port.
        assert_eq!(
            IpServiceId::tcp(7174).to_service_id(),
            0x0000_0000_0106_1c06
        );
        assert_eq!(
            IpServiceId::from_service_id(0x0000_0000_0106_1c06),
            Some(IpServiceId::tcp(7174))
        );
        assert_eq!(IpServiceId::from_service_id(0x1000_0000_0000_1004), None);
        assert_eq!(
            IpServiceId::from_service_id(0x0000_0000_0111_0035).map(|s| s.port_space),
            Some(PortSpace::Udp)
        );
    }

    #[test]
    fn ip_header_rejects_bad_versions_and_mixed_families() {
        let mut pd = [0u8; 56];
        pd[1] = 0x40;
        assert!(IpHeader::parse(&pd).is_ok());
        pd[0] = 0x10;
        assert_eq!(IpHeader::parse(&pd), Err(IpHeaderError::Version(0x10)));
        pd[0] = 0;
        pd[1] = 0x50;
        assert_eq!(IpHeader::parse(&pd), Err(IpHeaderError::IpVersion(5)));
        assert!(IpHeader::parse(&pd[..35]).is_err());
        let mixed = IpHeader {
            src_port: 1,
            src_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst_addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        assert_eq!(mixed.emit(&mut pd), Err(IpHeaderError::FamilyMismatch));
    }
}
