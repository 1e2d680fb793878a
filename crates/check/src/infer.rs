//! Inference of dependencies from a paired history: which transactions count as committed,
//! the write-write, write-read and read-write edges per key, and the anomalies seen without a
//! cycle (aborted and intermediate reads, garbage, internal inconsistency, incompatible orders).
//!
//! **list-append** is exact: a read returns a prefix of the key's version order, so the longest
//! read fixes the order of every element it holds, and every read is placed in it.
//!
//! **rw-register** is weaker, as in Elle: the version order is known only where a transaction
//! read a value (or the initial state) of a key and then wrote it, and the initial state comes
//! before every write. Write-read edges are exact; write-write and read-write edges come from
//! those known adjacencies.
//!
//! Committed means `ok`, or `info` with at least one write observed by a committed read.
//! Reads inside `fail` and `info` transactions are not used.

use crate::graph::{EdgeKind, Graph};
use crate::history::{Mop, Status, Txn};
use meridian_core::hash::FixedHashMap;
use std::collections::{BTreeMap, BTreeSet};

/// Anti-dependency edges from readers of a key's initial state to its writers, per key; the
/// relation is quadratic, so beyond this the extra edges (which only add detection power) are
/// left out.
pub const INITIAL_READ_EDGES_PER_KEY_MAX: usize = 100_000;
/// Writers a read gets real-time anti-dependency edges to (rw-register, strict checks): the
/// first writers that began after the read version's writer finished.
pub const REALTIME_FRONTIER_MAX: usize = 64;
/// Edges to the committed appends of a key that no read observed, per key (the same kind of
/// bound: these edges are quadratic and only add detection power).
pub const UNREAD_APPEND_EDGES_PER_KEY_MAX: usize = 100_000;

/// An anomaly found without a cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectAnomaly {
    /// Class name (`G1a`, `G1b`, `internal`, `incompatible-order`, `garbage-read`,
    /// `duplicate-elements`).
    pub class: &'static str,
    /// The transactions involved.
    pub txns: Vec<u32>,
    /// Key index.
    pub key: u32,
    /// What was seen.
    pub detail: String,
}

/// What inference produced.
#[derive(Debug)]
pub struct Inferred {
    /// The graph over all transactions (uncommitted ones have no edges).
    pub graph: Graph,
    /// Transactions counted as committed.
    pub committed: Vec<bool>,
    /// Anomalies found directly.
    pub direct: Vec<DirectAnomaly>,
}

/// Where a written value came from: the transaction and whether it was its last write to the key.
#[derive(Clone, Copy, Debug)]
struct Writer {
    txn: u32,
    last_to_key: bool,
}

/// Maps each (key, value) written to its writer; values must be unique per key.
fn writers(txns: &[Txn]) -> Result<FixedHashMap<(u32, i64), Writer>, String> {
    let mut map: FixedHashMap<(u32, i64), Writer> = FixedHashMap::default();
    for (t, txn) in txns.iter().enumerate() {
        let mut last: BTreeMap<u32, i64> = BTreeMap::new();
        for mop in &txn.mops {
            if let Mop::Append { key, value } | Mop::Write { key, value } = *mop {
                last.insert(key, value);
            }
        }
        for mop in &txn.mops {
            if let Mop::Append { key, value } | Mop::Write { key, value } = *mop {
                let writer = Writer { txn: t as u32, last_to_key: last[&key] == value };
                if let Some(other) = map.insert((key, value), writer) {
                    return Err(format!(
                        "value {value} is written to key #{key} by two transactions \
                         (invoked at positions {} and {}); written values must be unique per key",
                        txns[other.txn as usize].invoke_pos, txn.invoke_pos
                    ));
                }
            }
        }
    }
    Ok(map)
}

/// The reads of a committed transaction that observe other transactions: the first access of
/// each key when it is a read. Later reads of a key are checked for internal consistency.
fn external_reads(txn: &Txn) -> impl Iterator<Item = &Mop> {
    let mut touched: Vec<u32> = Vec::new();
    txn.mops.iter().filter(move |mop| {
        let key = mop.key();
        if touched.contains(&key) {
            return false;
        }
        touched.push(key);
        matches!(mop, Mop::ReadList { .. } | Mop::ReadRegister { .. })
    })
}

/// Infers a list-append history.
pub fn list_append(txns: &[Txn]) -> Result<Inferred, String> {
    let writer = writers(txns)?;
    let mut direct = Vec::new();
    let mut committed: Vec<bool> = txns.iter().map(|t| t.status == Status::Ok).collect();
    // The longest committed read of each key is its version order (so far as anyone saw).
    let mut order: BTreeMap<u32, (u32, &[i64])> = BTreeMap::new();
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        internal_list_check(t as u32, txn, &mut direct);
        for mop in external_reads(txn) {
            let Mop::ReadList { key, list: Some(list) } = mop else { continue };
            let longest = order.entry(*key).or_insert((t as u32, list.as_slice()));
            if list.len() > longest.1.len() {
                *longest = (t as u32, list.as_slice());
            }
        }
    }
    // Every element of the order must have a writer, appear once, and come from a transaction
    // that may have committed.
    let mut bad_keys: Vec<u32> = Vec::new();
    for (&key, &(reader, list)) in &order {
        let mut seen: FixedHashMap<i64, ()> = FixedHashMap::default();
        for &element in list {
            if seen.insert(element, ()).is_some() {
                direct.push(DirectAnomaly {
                    class: "duplicate-elements",
                    txns: vec![reader],
                    key,
                    detail: format!("element {element} appears twice in {list:?}"),
                });
                bad_keys.push(key);
                break;
            }
            match writer.get(&(key, element)) {
                None => {
                    direct.push(DirectAnomaly {
                        class: "garbage-read",
                        txns: vec![reader],
                        key,
                        detail: format!("read element {element}, which no transaction appended"),
                    });
                    bad_keys.push(key);
                    break;
                }
                Some(w) if txns[w.txn as usize].status == Status::Info => {
                    committed[w.txn as usize] = true;
                }
                Some(_) => {}
            }
        }
    }
    let mut graph = Graph::new(txns.len());
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        for mop in external_reads(txn) {
            let Mop::ReadList { key, list: Some(list) } = mop else { continue };
            if bad_keys.contains(key) {
                continue;
            }
            let (longest_reader, longest) = order[key];
            if !longest.starts_with(list) {
                direct.push(DirectAnomaly {
                    class: "incompatible-order",
                    txns: vec![longest_reader, t as u32],
                    key: *key,
                    detail: format!("read {list:?}, which is not a prefix of {longest:?}"),
                });
                continue;
            }
            if let Some(&last) = list.last() {
                let w = writer[&(*key, last)];
                let status = txns[w.txn as usize].status;
                if status == Status::Fail {
                    direct.push(DirectAnomaly {
                        class: "G1a",
                        txns: vec![t as u32, w.txn],
                        key: *key,
                        detail: format!("read element {last}, appended by an aborted transaction"),
                    });
                } else if !w.last_to_key && w.txn != t as u32 {
                    direct.push(DirectAnomaly {
                        class: "G1b",
                        txns: vec![t as u32, w.txn],
                        key: *key,
                        detail: format!(
                            "read {list:?}, ending at an intermediate append of the writer"
                        ),
                    });
                }
                graph.add(w.txn, t as u32, EdgeKind::Wr, *key);
            }
            if let Some(&next) = longest.get(list.len()) {
                graph.add(t as u32, writer[&(*key, next)].txn, EdgeKind::Rw, *key);
            }
        }
    }
    for (&key, &(_, list)) in &order {
        if bad_keys.contains(&key) {
            continue;
        }
        for pair in list.windows(2) {
            let (a, b) = (writer[&(key, pair[0])].txn, writer[&(key, pair[1])].txn);
            graph.add(a, b, EdgeKind::Ww, key);
        }
    }
    // Committed appends nobody read come after everything anyone read of that key: the
    // writer of the last element read, and every reader of the whole list, precede them.
    // (A transaction with some of its appends read and others not is reported as G1b above.)
    let mut unread: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let mut partly_read: BTreeSet<(u32, u32)> = BTreeSet::new();
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        for mop in &txn.mops {
            let Mop::Append { key, value } = *mop else { continue };
            if order.get(&key).is_some_and(|(_, list)| list.contains(&value)) {
                partly_read.insert((key, t as u32));
            } else if !bad_keys.contains(&key) {
                unread.entry(key).or_default().insert(t as u32);
            }
        }
    }
    for (key, appenders) in &mut unread {
        appenders.retain(|&t| !partly_read.contains(&(*key, t)));
    }
    for (key, appenders) in unread {
        let list = order.get(&key).map_or(&[][..], |(_, list)| *list);
        let mut predecessors: Vec<u32> =
            list.last().map(|e| writer[&(key, *e)].txn).into_iter().collect();
        for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
            let read_all = external_reads(txn).any(|m| {
                matches!(m, Mop::ReadList { key: k, list: Some(l) } if *k == key && l.len() == list.len())
            });
            if read_all {
                predecessors.push(t as u32);
            }
        }
        let mut added = 0;
        'key: for &p in &predecessors {
            let kind = if Some(&p) == predecessors.first() && !list.is_empty() {
                EdgeKind::Ww
            } else {
                EdgeKind::Rw
            };
            for &a in &appenders {
                if added == UNREAD_APPEND_EDGES_PER_KEY_MAX {
                    break 'key;
                }
                graph.add(p, a, kind, key);
                added += 1;
            }
        }
    }
    // Aborted transactions keep no edges into the cycle search.
    for (t, txn) in txns.iter().enumerate() {
        if txn.status == Status::Fail {
            committed[t] = false;
        }
    }
    Ok(Inferred { graph, committed, direct })
}

/// Within one transaction, a read of a key it appended to must show its own appends in order
/// after what it read before.
fn internal_list_check(t: u32, txn: &Txn, direct: &mut Vec<DirectAnomaly>) {
    // Per key: the list known so far (from a read), and the appends since.
    let mut state: BTreeMap<u32, (Option<Vec<i64>>, Vec<i64>)> = BTreeMap::new();
    for mop in &txn.mops {
        match mop {
            Mop::Append { key, value } => state.entry(*key).or_default().1.push(*value),
            Mop::ReadList { key, list: Some(list) } => {
                let entry = state.entry(*key).or_default();
                let consistent = match &entry.0 {
                    Some(known) => {
                        list.len() == known.len() + entry.1.len()
                            && list.starts_with(known)
                            && list.ends_with(&entry.1)
                    }
                    None => list.ends_with(&entry.1),
                };
                if !consistent {
                    direct.push(DirectAnomaly {
                        class: "internal",
                        txns: vec![t],
                        key: *key,
                        detail: format!(
                            "read {list:?} after its own appends {:?} to a list it saw as {:?}",
                            entry.1, entry.0
                        ),
                    });
                }
                *entry = (Some(list.clone()), Vec::new());
            }
            _ => {}
        }
    }
}

/// Infers an rw-register history.
pub fn rw_register(txns: &[Txn], realtime_versions: bool) -> Result<Inferred, String> {
    let writer = writers(txns)?;
    let mut direct = Vec::new();
    let mut committed: Vec<bool> = txns.iter().map(|t| t.status == Status::Ok).collect();
    let mut graph = Graph::new(txns.len());
    // Readers of each (key, value) and of each key's initial state.
    let mut readers: BTreeMap<(u32, Option<i64>), Vec<u32>> = BTreeMap::new();
    // Known adjacencies of the version order: (key, earlier value or initial) -> later value.
    let mut follows: Vec<(u32, Option<i64>, i64)> = Vec::new();
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        let t = t as u32;
        let mut seen: BTreeMap<u32, Option<i64>> = BTreeMap::new();
        let mut first_read: BTreeMap<u32, Option<i64>> = BTreeMap::new();
        let mut last_write: BTreeMap<u32, i64> = BTreeMap::new();
        for mop in &txn.mops {
            match *mop {
                Mop::ReadRegister { key, value: Some(value) } => {
                    if let Some(&expected) = seen.get(&key) {
                        if expected != value {
                            direct.push(DirectAnomaly {
                                class: "internal",
                                txns: vec![t],
                                key,
                                detail: format!("read {value:?} after seeing {expected:?}"),
                            });
                        }
                        continue;
                    }
                    seen.insert(key, value);
                    first_read.insert(key, value);
                    readers.entry((key, value)).or_default().push(t);
                    let Some(v) = value else { continue };
                    match writer.get(&(key, v)) {
                        None => direct.push(DirectAnomaly {
                            class: "garbage-read",
                            txns: vec![t],
                            key,
                            detail: format!("read {v}, which no transaction wrote"),
                        }),
                        Some(w) => {
                            let status = txns[w.txn as usize].status;
                            if status == Status::Fail {
                                direct.push(DirectAnomaly {
                                    class: "G1a",
                                    txns: vec![t, w.txn],
                                    key,
                                    detail: format!("read {v}, written by an aborted transaction"),
                                });
                                continue;
                            }
                            if !w.last_to_key && w.txn != t {
                                direct.push(DirectAnomaly {
                                    class: "G1b",
                                    txns: vec![t, w.txn],
                                    key,
                                    detail: format!(
                                        "read {v}, an intermediate write of its writer"
                                    ),
                                });
                            }
                            if status == Status::Info {
                                committed[w.txn as usize] = true;
                            }
                            graph.add(w.txn, t, EdgeKind::Wr, key);
                        }
                    }
                }
                Mop::Write { key, value } => {
                    seen.insert(key, Some(value));
                    last_write.insert(key, value);
                }
                _ => {}
            }
        }
        // A transaction that read a key first and then wrote it installed its last write
        // right after the version it read.
        for (key, value) in last_write {
            if let Some(&before) = first_read.get(&key) {
                follows.push((key, before, value));
            }
        }
    }
    for &(key, before, after) in &follows {
        let after_writer = writer[&(key, after)].txn;
        if let Some(v) = before {
            if let Some(w) = writer.get(&(key, v)) {
                graph.add(w.txn, after_writer, EdgeKind::Ww, key);
            }
        }
        for &r in readers.get(&(key, before)).into_iter().flatten() {
            graph.add(r, after_writer, EdgeKind::Rw, key);
        }
    }
    // The initial state precedes every write: readers of it anti-depend on every writer.
    let mut key_writers: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&(key, _), w) in writer.iter() {
        if w.last_to_key && txns[w.txn as usize].status != Status::Fail {
            key_writers.entry(key).or_default().push(w.txn);
        }
    }
    for (&(key, value), rs) in &readers {
        if value.is_some() {
            continue;
        }
        let Some(ws) = key_writers.get_mut(&key) else { continue };
        ws.sort_unstable();
        let mut added = 0;
        'key: for &r in rs {
            for &w in ws.iter() {
                if added == INITIAL_READ_EDGES_PER_KEY_MAX {
                    break 'key;
                }
                graph.add(r, w, EdgeKind::Rw, key);
                added += 1;
            }
        }
    }
    if realtime_versions {
        realtime_successors(txns, &writer, &readers, &committed, &mut graph);
    }
    for (t, txn) in txns.iter().enumerate() {
        if txn.status == Status::Fail {
            committed[t] = false;
        }
    }
    Ok(Inferred { graph, committed, direct })
}

/// Under strict serializability a write whose transaction completed before another writer of
/// the key was invoked comes first in the key's version order (Elle's real-time version
/// inference). So a reader of a version anti-depends on the writers that began after that
/// version's writer finished: the first of them in real time (the frontier; the rest follow
/// it through real-time edges). This is what catches a stale read of a register.
fn realtime_successors(
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    readers: &BTreeMap<(u32, Option<i64>), Vec<u32>>,
    committed: &[bool],
    graph: &mut Graph,
) {
    let timed = txns.iter().all(|t| {
        t.invoke_time.is_some() && (t.complete_pos.is_none() || t.complete_time.is_some())
    });
    let invoked = |t: &Txn| if timed { t.invoke_time.unwrap_or(0) } else { t.invoke_pos as u64 };
    let completed = |t: &Txn| match (t.status, timed) {
        (Status::Ok, true) => t.complete_time,
        (Status::Ok, false) => t.complete_pos.map(|p| p as u64),
        _ => None, // An unknown outcome may take effect at any later time.
    };
    // Per key: its committed writers sorted by invocation, with the earliest completion among
    // each suffix.
    let mut by_key: BTreeMap<u32, Vec<(u64, u64, u32)>> = BTreeMap::new();
    for (&(key, _), w) in writer.iter() {
        let txn = &txns[w.txn as usize];
        if w.last_to_key && committed[w.txn as usize] {
            by_key.entry(key).or_default().push((
                invoked(txn),
                completed(txn).unwrap_or(u64::MAX),
                w.txn,
            ));
        }
    }
    for writers in by_key.values_mut() {
        writers.sort_unstable();
    }
    let suffix_min: BTreeMap<u32, Vec<u64>> = by_key
        .iter()
        .map(|(&key, ws)| {
            let mut mins = vec![u64::MAX; ws.len() + 1];
            for i in (0..ws.len()).rev() {
                mins[i] = mins[i + 1].min(ws[i].1);
            }
            (key, mins)
        })
        .collect();
    for (&(key, value), rs) in readers {
        let Some(v) = value else { continue };
        let Some(w) = writer.get(&(key, v)) else { continue };
        let Some(done) = completed(&txns[w.txn as usize]) else { continue };
        let (Some(ws), Some(mins)) = (by_key.get(&key), suffix_min.get(&key)) else { continue };
        // Writers invoked after `done`; the frontier ends where one of them has completed.
        let first = ws.partition_point(|&(inv, _, _)| inv <= done);
        let bound = mins[first];
        for &(inv, _, successor) in
            ws[first..].iter().take_while(|&&(inv, _, _)| inv < bound).take(REALTIME_FRONTIER_MAX)
        {
            debug_assert!(inv > done);
            for &r in rs {
                if committed[r as usize] && r != successor {
                    graph.add(r, successor, EdgeKind::Rw, key);
                }
            }
        }
    }
}
