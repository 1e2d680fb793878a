//! A node's incarnation: a number that grows with every start of the node, handed to it so
//! that its transaction ids never repeat across restarts, whatever its clock does.
//!
//! A process with a data directory keeps the number in `DIR/incarnation` and raises it, durably
//! (a temporary file synced, renamed, the directory synced), before the node starts. The first
//! start is incarnation 0, as in the simulator: nodes take an incarnation above 0 to mean a
//! restart (tiga's followers rejoin, a view-manager member without its records sits out). A process
//! without one (memory durability, the coordinators of `bench --cluster`) has no state to
//! repeat ids against except the servers' memory of its earlier runs; it takes the wall clock
//! in nanoseconds. A clock stepped back across such a restart can make its ids look older than
//! ones the servers have forgotten: they then answer "forgotten" (and the requests report an
//! unknown outcome) rather than anything wrong.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

/// The file holding the number.
pub const FILE: &str = "incarnation";

/// Raises and returns the incarnation kept in `dir` (0 on the first start).
pub fn next_in(dir: &Path) -> Result<u64, String> {
    let path = dir.join(FILE);
    let next = match fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| {
                format!("{}: '{}' is not an incarnation number", path.display(), text.trim())
            })?
            .checked_add(1)
            .ok_or_else(|| format!("{}: the incarnation number is exhausted", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
    };
    let tmp = dir.join(format!("{FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&tmp)?;
        writeln!(file, "{next}")?;
        file.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    };
    write().map_err(|e| format!("{}: cannot record the incarnation: {e}", path.display()))?;
    Ok(next)
}

/// The incarnation of a process with no durable state: the wall clock in nanoseconds.
pub fn from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_grows_with_every_start_and_bad_files_are_errors() {
        let dir = std::env::temp_dir().join(format!("meridian-incarnation-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(next_in(&dir), Ok(0), "the first start, as in the simulator");
        assert_eq!(next_in(&dir), Ok(1));
        assert_eq!(next_in(&dir), Ok(2));
        fs::write(dir.join(FILE), "garbage\n").unwrap();
        assert!(next_in(&dir).unwrap_err().contains("not an incarnation number"));
        let _ = fs::remove_dir_all(&dir);
    }
}
