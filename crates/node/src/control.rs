//! A server's fault control: a small text file that a fault injector on the same machine
//! (`meridian nemesis`) writes and a server started with `--fault-control FILE` reads about
//! every [`CONTROL_POLL_MS`] milliseconds. It states the faults the server must act out now,
//! not a log of commands, so a server restarted in the middle of a fault takes it up again
//! (a machine whose clock is wrong stays wrong across a process restart; a partitioned host
//! stays partitioned):
//!
//! ```text
//! # meridian fault control
//! cut 3 4 5
//! clock_offset_ns -250000000
//! disk_delay_ns 20000000
//! disk_fail fsync
//! ```
//!
//! - `cut`: the nodes this server's messages to are dropped (at the sender, by the runtime's
//!   link layer), one direction; the injector writes the other direction into the peers'
//!   files;
//! - `clock_offset_ns`: how far this server's clock is off from the machine's;
//! - `disk_delay_ns`: how much longer each group commit of its log takes;
//! - `disk_fail`: the next group commit of its log fails as a failing disk would (`fsync`:
//!   the sync reports an I/O error; `full`: no space left; `torn`: half the batch written),
//!   and the server stops without acknowledging anything of it.
//!
//! Missing lines mean no fault. Only the local file system reaches the file, so whoever can
//! write it could also kill the process: the control grants nothing new. A file that does not
//! parse changes nothing (the server logs why and keeps its last state).

use meridian_core::NodeId;
use meridian_runtime::logstore::DiskFailure;
use std::collections::BTreeSet;

/// How often a server looks at its control file.
pub const CONTROL_POLL_MS: u64 = 50;
/// Largest control file read; a longer one is refused.
pub const CONTROL_BYTES_MAX: usize = 16 * 1024;
/// Largest clock offset or disk delay accepted (an hour).
pub const CONTROL_MAGNITUDE_NS_MAX: u64 = 3_600 * 1_000_000_000;

/// The faults a server acts out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultControl {
    /// Peers this server's messages to are dropped.
    pub cut: BTreeSet<NodeId>,
    /// The server's clock offset from the machine's.
    pub clock_offset_ns: i64,
    /// Added to each group commit of the server's log.
    pub disk_delay_ns: u64,
    /// A failure the next group commit of the server's log meets.
    pub disk_fail: Option<DiskFailure>,
}

impl FaultControl {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut text = String::from("# meridian fault control\n");
        if !self.cut.is_empty() {
            let nodes: Vec<String> = self.cut.iter().map(|n| n.0.to_string()).collect();
            text += &format!("cut {}\n", nodes.join(" "));
        }
        if self.clock_offset_ns != 0 {
            text += &format!("clock_offset_ns {}\n", self.clock_offset_ns);
        }
        if self.disk_delay_ns != 0 {
            text += &format!("disk_delay_ns {}\n", self.disk_delay_ns);
        }
        if let Some(failure) = self.disk_fail {
            text += &format!("disk_fail {}\n", failure.name());
        }
        text
    }

    /// Reads a control file's text; `nodes` is the cluster's node count.
    pub fn parse(text: &str, nodes: usize) -> Result<Self, String> {
        if text.len() > CONTROL_BYTES_MAX {
            return Err(format!("longer than {CONTROL_BYTES_MAX} bytes"));
        }
        let mut control = Self::default();
        let mut seen = BTreeSet::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let mut words = line.split_whitespace();
            let Some(name) = words.next() else { continue };
            let at = |why: String| format!("line {}: {why}", number + 1);
            if !seen.insert(name.to_string()) {
                return Err(at(format!("'{name}' given twice")));
            }
            let rest: Vec<&str> = words.collect();
            let one = || match rest.as_slice() {
                [value] => Ok(*value),
                _ => Err(at(format!("'{name}' takes one value"))),
            };
            match name {
                "cut" => {
                    for word in &rest {
                        let id: u32 = word
                            .parse()
                            .map_err(|_| at(format!("node '{word}' is not a number")))?;
                        if id as usize >= nodes {
                            return Err(at(format!("node {id} is not in the cluster")));
                        }
                        control.cut.insert(NodeId(id));
                    }
                }
                "clock_offset_ns" => {
                    let value = one()?;
                    let ns: i64 =
                        value.parse().map_err(|_| at(format!("'{value}' is not a number")))?;
                    if ns.unsigned_abs() > CONTROL_MAGNITUDE_NS_MAX {
                        return Err(at(format!("{ns} is beyond an hour")));
                    }
                    control.clock_offset_ns = ns;
                }
                "disk_delay_ns" => {
                    let value = one()?;
                    let ns: u64 =
                        value.parse().map_err(|_| at(format!("'{value}' is not a number")))?;
                    if ns > CONTROL_MAGNITUDE_NS_MAX {
                        return Err(at(format!("{ns} is beyond an hour")));
                    }
                    control.disk_delay_ns = ns;
                }
                "disk_fail" => control.disk_fail = Some(DiskFailure::parse(one()?).map_err(at)?),
                other => return Err(at(format!("unknown setting '{other}'"))),
            }
        }
        Ok(control)
    }

    /// Writes the file so that a reader sees the old or the new text, never a mix.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let temporary = path.with_extension("writing");
        std::fs::write(&temporary, self.render())?;
        std::fs::rename(&temporary, path)
    }
}

/// What a server has acted out so far, to turn a newly read state into changes.
#[derive(Debug, Default)]
pub struct Applied {
    state: FaultControl,
}

/// One change to carry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlChange {
    /// Cut (true) or restore (false) the link to this peer.
    Cut(NodeId, bool),
    /// Step the clock by this much.
    ClockStep(i64),
    /// Set the disk delay.
    DiskDelay(u64),
    /// Arm (or disarm) a disk failure.
    DiskFail(Option<DiskFailure>),
}

impl Applied {
    /// The changes that take the server from what it acts out to `next`, which it then acts
    /// out.
    pub fn changes_to(&mut self, next: FaultControl) -> Vec<ControlChange> {
        let mut changes = Vec::new();
        for gone in self.state.cut.difference(&next.cut) {
            changes.push(ControlChange::Cut(*gone, false));
        }
        for new in next.cut.difference(&self.state.cut) {
            changes.push(ControlChange::Cut(*new, true));
        }
        if next.clock_offset_ns != self.state.clock_offset_ns {
            changes.push(ControlChange::ClockStep(
                next.clock_offset_ns.saturating_sub(self.state.clock_offset_ns),
            ));
        }
        if next.disk_delay_ns != self.state.disk_delay_ns {
            changes.push(ControlChange::DiskDelay(next.disk_delay_ns));
        }
        if next.disk_fail != self.state.disk_fail {
            changes.push(ControlChange::DiskFail(next.disk_fail));
        }
        self.state = next;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_file_round_trips_and_turns_into_the_changes_between_states() {
        let control = FaultControl {
            cut: [NodeId(3), NodeId(5)].into_iter().collect(),
            clock_offset_ns: -250_000_000,
            disk_delay_ns: 20_000_000,
            disk_fail: Some(DiskFailure::Torn),
        };
        let parsed = FaultControl::parse(&control.render(), 9).unwrap();
        assert_eq!(parsed, control);
        assert_eq!(FaultControl::parse("# nothing\n\n", 9).unwrap(), FaultControl::default());
        let mut applied = Applied::default();
        let first = applied.changes_to(parsed);
        assert_eq!(
            first,
            [
                ControlChange::Cut(NodeId(3), true),
                ControlChange::Cut(NodeId(5), true),
                ControlChange::ClockStep(-250_000_000),
                ControlChange::DiskDelay(20_000_000),
                ControlChange::DiskFail(Some(DiskFailure::Torn)),
            ]
        );
        let next = FaultControl {
            cut: [NodeId(5), NodeId(6)].into_iter().collect(),
            clock_offset_ns: 0,
            disk_delay_ns: 20_000_000,
            disk_fail: None,
        };
        assert_eq!(
            applied.changes_to(next.clone()),
            [
                ControlChange::Cut(NodeId(3), false),
                ControlChange::Cut(NodeId(6), true),
                ControlChange::ClockStep(250_000_000),
                ControlChange::DiskFail(None),
            ]
        );
        assert!(applied.changes_to(next).is_empty(), "the same state again changes nothing");
    }

    #[test]
    fn a_bad_control_file_is_refused_with_its_line() {
        for (text, says) in [
            ("cut 9", "line 1: node 9 is not in the cluster"),
            ("cut x", "not a number"),
            ("clock_offset_ns 1 2", "takes one value"),
            ("disk_delay_ns -5", "not a number"),
            ("disk_delay_ns 1\ndisk_delay_ns 2", "line 2: 'disk_delay_ns' given twice"),
            ("clock_offset_ns 9999999999999999", "beyond an hour"),
            ("reboot now", "unknown setting 'reboot'"),
            ("disk_fail melt", "line 1: unknown disk failure 'melt'"),
        ] {
            let error = FaultControl::parse(text, 9).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        let long = "#".repeat(CONTROL_BYTES_MAX + 1);
        assert!(FaultControl::parse(&long, 9).unwrap_err().contains("longer than"));
    }
}
