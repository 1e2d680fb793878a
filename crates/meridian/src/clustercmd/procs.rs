//! What runs on this machine, read from `/proc` (Linux): which process listens on an address,
//! and whether a process is a `meridian server` (and of which node, with which data
//! directory). `cluster` identifies servers this way, by what actually listens, so that a
//! server restarted by hand, or one whose recorded process id went stale, is found.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Bytes of one `/proc` file read at most.
const PROC_FILE_BYTES_MAX: u64 = 16 << 20;
/// Open files of one process looked at, at most.
const FDS_PER_PROCESS_MAX: usize = 1 << 16;

/// A `meridian server` process, as its command line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ServerProc {
    pub(super) pid: u32,
    pub(super) node: Option<u32>,
    pub(super) data_dir: Option<PathBuf>,
}

fn read_bounded(path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(PROC_FILE_BYTES_MAX).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The socket inodes listening on `addr` (or on the wildcard address of its port).
fn listening_inodes(addr: SocketAddr) -> Vec<u64> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Some(text) = read_bounded(table) else { continue };
        for line in String::from_utf8_lossy(&text).lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let Some((ip, port)) = parse_local(local) else { continue };
            // A wildcard listener (0.0.0.0, ::) takes the port on every address.
            if port == addr.port() && (ip == addr.ip() || ip.is_unspecified()) {
                if let Ok(inode) = inode.parse() {
                    inodes.push(inode);
                }
            }
        }
    }
    inodes
}

/// `0100007F:1F90` (IPv4: one 32-bit word, native order) or 32 hex digits (IPv6: four
/// words), then the port in big-endian hex.
fn parse_local(text: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::from(word(ip)?),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            let v6 = std::net::Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some((ip, port))
}

/// The process listening on `addr`, when this user may see it.
pub(super) fn listener(addr: SocketAddr) -> Option<u32> {
    let wanted: Vec<String> =
        listening_inodes(addr).into_iter().map(|i| format!("socket:[{i}]")).collect();
    if wanted.is_empty() {
        return None;
    }
    let processes = std::fs::read_dir("/proc").ok()?;
    for entry in processes.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten().take(FDS_PER_PROCESS_MAX) {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if wanted.iter().any(|w| target.as_os_str() == w.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

/// `pid` as a live `meridian server`, with its node and data directory (`None` for another
/// program, a zombie, or a process that is gone).
pub(super) fn server(pid: u32) -> Option<ServerProc> {
    let cmdline = read_bounded(&format!("/proc/{pid}/cmdline"))?;
    let stat = read_bounded(&format!("/proc/{pid}/stat"))?;
    let zombie = String::from_utf8_lossy(&stat)
        .rsplit(')')
        .next()
        .is_some_and(|rest| rest.trim_start().starts_with('Z'));
    let words: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let ours = words.first().is_some_and(|w| w.ends_with("meridian"))
        && words.iter().any(|w| w == "server");
    if zombie || !ours {
        return None;
    }
    let after = |flag: &str| words.iter().position(|w| w == flag).and_then(|i| words.get(i + 1));
    Some(ServerProc {
        pid,
        node: after("--node").and_then(|n| n.parse().ok()),
        data_dir: after("--data-dir").map(PathBuf::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_addresses_parse() {
        let local = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(parse_local(&local), Some(("127.0.0.1".parse().unwrap(), 8080)));
        assert_eq!(parse_local("00000000:0050"), Some(("0.0.0.0".parse().unwrap(), 80)));
        assert_eq!(parse_local("00000000000000000000000000000000:0050").unwrap().1, 80);
        assert_eq!(parse_local("zz:1"), None);
        assert_eq!(parse_local("0100007F"), None);
    }

    #[test]
    fn this_test_process_is_found_listening_and_is_no_server() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        assert_eq!(listener(addr), Some(std::process::id()));
        assert_eq!(server(std::process::id()), None, "a test binary is not a meridian server");
        drop(socket);
        assert_eq!(listener(addr), None);
    }
}
