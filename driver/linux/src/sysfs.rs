//! What the kernel tells about an RDMA device in sysfs (`/sys/class/infiniband`,
//! `/sys/class/infiniband_mad`): its umad device and its CA GUID.

use std::io;
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
