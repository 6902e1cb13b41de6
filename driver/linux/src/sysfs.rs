//! What the kernel tells about an RDMA device in sysfs (`/sys/class/infiniband`,
//! `/sys/class/infiniband_mad`): its umad device, its GID table and its CA GUID.

use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;

fn read(path: impl Into<PathBuf>) -> io::Result<String> {
    let path = path.into();
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn not_found(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, what)
}

/// The `/dev/infiniband/umadN` of `device`'s `port` (`/sys/class/infiniband_mad/umadN/ibdev`
/// and `port`).
pub fn umad_path(device: &str, port: u8) -> io::Result<PathBuf> {
    for entry in std::fs::read_dir("/sys/class/infiniband_mad")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("umad") {
            continue;
        }
        let dir = entry.path();
        if read(dir.join("ibdev")).ok().as_deref() == Some(device)
            && read(dir.join("port")).ok() == Some(port.to_string())
        {
            return Ok(PathBuf::from("/dev/infiniband").join(name));
        }
    }
    Err(not_found(format!(
        "no umad device for {device} port {port} (is ib_umad loaded?)"
    )))
}

/// The CA GUID (`node_guid`, printed as four groups of four hex digits).
pub fn node_guid(device: &str) -> io::Result<u64> {
    let text = read(format!("/sys/class/infiniband/{device}/node_guid"))?;
    u64::from_str_radix(&text.replace(':', ""), 16)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("node_guid {text}: {e}")))
}

/// Parses a GID as sysfs prints it (eight groups of four hex digits).
fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    let mut groups = text.split(':');
    for pair in gid.chunks_exact_mut(2) {
        let v = u16::from_str_radix(groups.next()?, 16).ok()?;
        pair.copy_from_slice(&v.to_be_bytes());
    }
    groups.next().is_none().then_some(gid)
}

/// The index of the RoCEv2 GID `::ffff:addr` in `device`'s `port` GID table (the entry
/// whose `gid_attrs/types/N` is "RoCE v2"): the source GID of every packet to `addr`'s
/// link, and of the MADs.
pub fn roce_v2_gid_index(device: &str, port: u8, addr: Ipv4Addr) -> io::Result<u8> {
    let want = addr.to_ipv6_mapped().octets();
    let base = format!("/sys/class/infiniband/{device}/ports/{port}");
    for index in 0..=u8::MAX {
        let Ok(text) = read(format!("{base}/gids/{index}")) else {
            break;
        };
        if parse_gid(&text) != Some(want) {
            continue;
        }
        if read(format!("{base}/gid_attrs/types/{index}"))
            .ok()
            .as_deref()
            == Some("RoCE v2")
        {
            return Ok(index);
        }
    }
    Err(not_found(format!(
        "{device} port {port} has no RoCE v2 GID for {addr}"
    )))
}

#[cfg(test)]
mod tests {
    use super::parse_gid;

    #[test]
    fn a_gid_as_sysfs_prints_it() {
        let gid = parse_gid("0000:0000:0000:0000:0000:ffff:0a4d:0002").unwrap();
        assert_eq!(gid[10..], [0xff, 0xff, 10, 77, 0, 2]);
        assert_eq!(parse_gid("0000:0000"), None);
        assert_eq!(
            parse_gid("0000:0000:0000:0000:0000:ffff:0a4d:0002:0000"),
            None
        );
    }
}
