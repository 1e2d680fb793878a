//! Inference of dependencies from a paired history: which transactions count as committed,
//! the write-write, write-read and read-write edges per key, and the anomalies seen without a
//! cycle (aborted and intermediate reads, dirty updates, future reads, garbage, internal
//! inconsistency, incompatible orders).
//!
//! **list-append** is exact: every committed read, including one made after the reader's own
//! appends, returns a prefix of the key's version order, so the longest read fixes the order of
//! every element it holds and every read is placed in it. A reader depends on what it saw from
//! others (its read without its own appends at the end). A committed append no read shows
//! comes after the whole order, hence after every reader of the key. With the checks on the
//! order itself (each element appended once, by a transaction that did not fail, each
//! transaction's appends in its own order), a history without anomalies has a serial order:
//! any topological order of the graph replays every read (within the edge bounds below; a brute
//! force oracle agrees on small histories, `tests/adversarial.rs`).
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
    /// Class name (`G1a`, `G1b`, `dirty-update`, `future-read`, `internal`,
    /// `incompatible-order`, `garbage-read`, `duplicate-elements`).
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

/// Where a written value came from: the transaction, whether it was its last write to the key,
/// and how many writes to the key the transaction made before it.
#[derive(Clone, Copy, Debug)]
struct Writer {
    txn: u32,
    last_to_key: bool,
    ordinal: u32,
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
        let mut written: BTreeMap<u32, u32> = BTreeMap::new();
        for mop in &txn.mops {
            if let Mop::Append { key, value } | Mop::Write { key, value } = *mop {
                let ordinal = written.entry(key).or_default();
                let writer =
                    Writer { txn: t as u32, last_to_key: last[&key] == value, ordinal: *ordinal };
                *ordinal += 1;
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

/// A list read of a committed transaction. Every such read is a prefix of the key's final
/// version order (a read after the reader's own appends shows them at its end), so all of them
/// place elements; only the part the reader saw from others yields dependencies.
struct ListRead<'a> {
    txn: u32,
    key: u32,
    list: &'a [i64],
    /// How many leading elements the transaction saw from others: the list without its own
    /// appends made before the read. `None` when the read adds nothing external (the key was
    /// read before) or does not end with those appends (reported as internal).
    external: Option<usize>,
}

/// The list reads of one committed transaction, in order.
fn list_reads(t: u32, txn: &Txn) -> Vec<ListRead<'_>> {
    // Per key: whether it was read already, and the appends made before its first read.
    let mut state: BTreeMap<u32, (bool, Vec<i64>)> = BTreeMap::new();
    let mut reads = Vec::new();
    for mop in &txn.mops {
        match mop {
            Mop::Append { key, value } => {
                let entry = state.entry(*key).or_default();
                if !entry.0 {
                    entry.1.push(*value);
                }
            }
            Mop::ReadList { key, list: Some(list) } => {
                let entry = state.entry(*key).or_default();
                let external =
                    (!entry.0 && list.ends_with(&entry.1)).then(|| list.len() - entry.1.len());
                entry.0 = true;
                reads.push(ListRead { txn: t, key: *key, list, external });
            }
            _ => {}
        }
    }
    reads
}

/// Infers a list-append history.
pub fn list_append(txns: &[Txn]) -> Result<Inferred, String> {
    let writer = writers(txns)?;
    let mut direct = Vec::new();
    let mut committed: Vec<bool> = txns.iter().map(|t| t.status == Status::Ok).collect();
    let mut reads: Vec<ListRead> = Vec::new();
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        internal_list_check(t as u32, txn, &mut direct);
        reads.extend(list_reads(t as u32, txn));
    }
    // Aborted reads: any element of any committed read appended by a failed transaction
    // (only keys with a failed append need the scan).
    let failed_keys: BTreeSet<u32> = writer
        .iter()
        .filter(|(_, w)| txns[w.txn as usize].status == Status::Fail)
        .map(|(&(key, _), _)| key)
        .collect();
    for read in reads.iter().filter(|r| failed_keys.contains(&r.key)) {
        aborted_read_check(read, txns, &writer, &mut direct);
    }
    // The longest committed read of each key is its version order (so far as anyone saw).
    let mut order: BTreeMap<u32, (u32, &[i64])> = BTreeMap::new();
    for read in &reads {
        let longest = order.entry(read.key).or_insert((read.txn, read.list));
        if read.list.len() > longest.1.len() {
            *longest = (read.txn, read.list);
        }
    }
    // Every element of the order must have a writer, appear once, and come from a transaction
    // that may have committed; each writer's appends must appear in the order it made them.
    let mut bad_keys: BTreeSet<u32> = BTreeSet::new();
    for (&key, &(reader, list)) in &order {
        if let Some(anomaly) = order_check(key, reader, list, txns, &writer, &mut committed) {
            if matches!(anomaly.class, "garbage-read" | "duplicate-elements") {
                bad_keys.insert(key);
            }
            direct.push(anomaly);
        }
        if !bad_keys.contains(&key) {
            direct.extend(dirty_update(key, reader, list, txns, &writer));
        }
    }
    let mut graph = Graph::new(txns.len());
    // Per key: the committed readers with how much each saw from others.
    let mut readers: BTreeMap<u32, Vec<(u32, usize)>> = BTreeMap::new();
    for read in &reads {
        let key = read.key;
        if bad_keys.contains(&key) {
            continue;
        }
        let (longest_reader, longest) = order[&key];
        if !longest.starts_with(read.list) {
            direct.push(DirectAnomaly {
                class: "incompatible-order",
                txns: vec![longest_reader, read.txn],
                key,
                detail: format!("read {:?}, which is not a prefix of {longest:?}", read.list),
            });
            continue;
        }
        let Some(seen) = read.external else { continue };
        readers.entry(key).or_default().push((read.txn, seen));
        if let Some(&last) = read.list[..seen].last() {
            let w = writer[&(key, last)];
            let failed = txns[w.txn as usize].status == Status::Fail;
            if !failed && !w.last_to_key && w.txn != read.txn {
                direct.push(DirectAnomaly {
                    class: "G1b",
                    txns: vec![read.txn, w.txn],
                    key,
                    detail: format!(
                        "read {:?}, which saw others' appends up to an intermediate append \
                         of its writer",
                        read.list
                    ),
                });
            }
            graph.add(w.txn, read.txn, EdgeKind::Wr, key);
        }
        if let Some(&next) = longest.get(seen) {
            graph.add(read.txn, writer[&(key, next)].txn, EdgeKind::Rw, key);
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
    unobserved_appends(txns, &writer, &order, &bad_keys, &readers, &committed, &mut graph);
    // Aborted transactions keep no edges into the cycle search.
    for (t, txn) in txns.iter().enumerate() {
        if txn.status == Status::Fail {
            committed[t] = false;
        }
    }
    Ok(Inferred { graph, committed, direct })
}

/// G1a: a committed read holding elements appended by failed transactions, wherever they sit
/// in the list (one anomaly per read).
fn aborted_read_check(
    read: &ListRead,
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    direct: &mut Vec<DirectAnomaly>,
) {
    let mut elements = Vec::new();
    let mut involved = vec![read.txn];
    for &element in read.list {
        let Some(w) = writer.get(&(read.key, element)) else { continue };
        if txns[w.txn as usize].status == Status::Fail {
            elements.push(element);
            if !involved.contains(&w.txn) {
                involved.push(w.txn);
            }
        }
    }
    if !elements.is_empty() {
        direct.push(DirectAnomaly {
            class: "G1a",
            txns: involved,
            key: read.key,
            detail: format!(
                "read {:?}, holding {elements:?} appended by aborted transactions",
                read.list
            ),
        });
    }
}

/// Checks a key's version order: every element written once by someone, and each writer's
/// appends in the order it made them. Marks writers of unknown outcome as committed, since a
/// committed read saw their appends. Returns the first problem found.
fn order_check(
    key: u32,
    reader: u32,
    list: &[i64],
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    committed: &mut [bool],
) -> Option<DirectAnomaly> {
    let mut seen: FixedHashMap<i64, ()> = FixedHashMap::default();
    // Per writer: the ordinal of its last append seen so far in the list.
    let mut last_ordinal: FixedHashMap<u32, u32> = FixedHashMap::default();
    let mut found = None;
    for &element in list {
        if seen.insert(element, ()).is_some() {
            return Some(DirectAnomaly {
                class: "duplicate-elements",
                txns: vec![reader],
                key,
                detail: format!("element {element} appears twice in {list:?}"),
            });
        }
        let Some(w) = writer.get(&(key, element)) else {
            return Some(DirectAnomaly {
                class: "garbage-read",
                txns: vec![reader],
                key,
                detail: format!("read element {element}, which no transaction appended"),
            });
        };
        if txns[w.txn as usize].status == Status::Info {
            committed[w.txn as usize] = true;
        }
        let before = last_ordinal.insert(w.txn, w.ordinal);
        if found.is_none() && before.is_some_and(|o| o > w.ordinal) {
            found = Some(DirectAnomaly {
                class: "incompatible-order",
                txns: vec![reader, w.txn],
                key,
                detail: format!(
                    "{list:?} shows element {element} after a later append of the same \
                     transaction"
                ),
            });
        }
    }
    found
}

/// Dirty update: in a key's version order, an append of a transaction that may have committed
/// after one of a failed transaction (the committed state built on the aborted one).
fn dirty_update(
    key: u32,
    reader: u32,
    list: &[i64],
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
) -> Option<DirectAnomaly> {
    let status = |e: &i64| txns[writer[&(key, *e)].txn as usize].status;
    let aborted = list.iter().position(|e| status(e) == Status::Fail)?;
    let after = list[aborted..].iter().find(|e| status(e) != Status::Fail)?;
    Some(DirectAnomaly {
        class: "dirty-update",
        txns: vec![reader, writer[&(key, list[aborted])].txn, writer[&(key, *after)].txn],
        key,
        detail: format!(
            "{list:?} holds element {after}, appended by a transaction that was not aborted, \
             after {}, appended by an aborted one",
            list[aborted]
        ),
    })
}

/// A committed append that no read shows comes after every element of the key's version
/// order: the writer of its last element precedes the appender (ww), and so does every
/// committed reader of the key (rw: none of them saw the append). This holds for transactions
/// of unknown outcome counted as committed too: some read saw one of their appends, so all of
/// them took effect. Other unknown outcomes have no edges at all.
fn unobserved_appends(
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    order: &BTreeMap<u32, (u32, &[i64])>,
    bad_keys: &BTreeSet<u32>,
    readers: &BTreeMap<u32, Vec<(u32, usize)>>,
    committed: &[bool],
    graph: &mut Graph,
) {
    let mut observed: FixedHashMap<(u32, i64), ()> = FixedHashMap::default();
    for (&key, &(_, list)) in order {
        observed.extend(list.iter().map(|&e| ((key, e), ())));
    }
    let mut unobserved: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for (t, txn) in txns.iter().enumerate() {
        if !committed[t] || txn.status == Status::Fail {
            continue;
        }
        for mop in &txn.mops {
            let Mop::Append { key, value } = *mop else { continue };
            if !bad_keys.contains(&key) && !observed.contains_key(&(key, value)) {
                unobserved.entry(key).or_default().insert(t as u32);
            }
        }
    }
    for (key, appenders) in unobserved {
        let list = order.get(&key).map_or(&[][..], |(_, list)| *list);
        if let Some(last) = list.last() {
            let w = writer[&(key, *last)].txn;
            for &a in &appenders {
                graph.add(w, a, EdgeKind::Ww, key);
            }
        }
        // Readers of the whole order first: readers of shorter prefixes already reach the
        // appenders through the next element's writer, so the bound costs only shortcuts.
        let mut of_key: Vec<(u32, usize)> = readers.get(&key).cloned().unwrap_or_default();
        of_key.sort_by_key(|&(r, seen)| (seen != list.len(), r));
        let mut added = 0;
        'key: for (r, _) in of_key {
            for &a in &appenders {
                if added == UNREAD_APPEND_EDGES_PER_KEY_MAX {
                    break 'key;
                }
                graph.add(r, a, EdgeKind::Rw, key);
                added += 1;
            }
        }
    }
}

/// Within one transaction, a read of a key it appended to must show its own appends in order
/// after what it read before, and no read may show an element the transaction appends later
/// (a future read).
fn internal_list_check(t: u32, txn: &Txn, direct: &mut Vec<DirectAnomaly>) {
    // Per key: the list known so far (from a read), and the appends since.
    let mut state: BTreeMap<u32, (Option<Vec<i64>>, Vec<i64>)> = BTreeMap::new();
    // Per key: the elements of its reads so far, indexed only once an append follows a read
    // (most transactions never read a key and then append to it).
    let mut unindexed: BTreeMap<u32, Vec<&[i64]>> = BTreeMap::new();
    let mut read: FixedHashMap<(u32, i64), ()> = FixedHashMap::default();
    for mop in &txn.mops {
        match mop {
            Mop::Append { key, value } => {
                for list in unindexed.remove(key).into_iter().flatten() {
                    read.extend(list.iter().map(|&e| ((*key, e), ())));
                }
                if read.contains_key(&(*key, *value)) {
                    direct.push(DirectAnomaly {
                        class: "future-read",
                        txns: vec![t],
                        key: *key,
                        detail: format!("read element {value} before appending it"),
                    });
                }
                state.entry(*key).or_default().1.push(*value);
            }
            Mop::ReadList { key, list: Some(list) } => {
                unindexed.entry(*key).or_default().push(list);
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

/// Readers of each (key, value) and of each key's initial state (`None`).
type RegisterReaders = BTreeMap<(u32, Option<i64>), Vec<u32>>;

/// Infers an rw-register history.
pub fn rw_register(txns: &[Txn], realtime_versions: bool) -> Result<Inferred, String> {
    let writer = writers(txns)?;
    let mut inferred = Inferred {
        direct: Vec::new(),
        committed: txns.iter().map(|t| t.status == Status::Ok).collect(),
        graph: Graph::new(txns.len()),
    };
    let mut readers: RegisterReaders = BTreeMap::new();
    // Known adjacencies of the version order: (key, earlier value or initial) -> later value.
    let mut follows: Vec<(u32, Option<i64>, i64)> = Vec::new();
    for (t, txn) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Ok) {
        register_reads(t as u32, txn, txns, &writer, &mut inferred, &mut readers, &mut follows);
    }
    let Inferred { mut graph, mut committed, direct } = inferred;
    follows_edges(&follows, &writer, &readers, &mut graph);
    initial_read_edges(txns, &writer, &readers, &mut graph);
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

/// The register reads of committed transaction `t`: its internal consistency, the readers
/// of each version it saw first, and (into `follows`) the version its last write to a key it
/// read first came right after.
fn register_reads(
    t: u32,
    txn: &Txn,
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    inferred: &mut Inferred,
    readers: &mut RegisterReaders,
    follows: &mut Vec<(u32, Option<i64>, i64)>,
) {
    let mut seen: BTreeMap<u32, Option<i64>> = BTreeMap::new();
    let mut first_read: BTreeMap<u32, Option<i64>> = BTreeMap::new();
    let mut last_write: BTreeMap<u32, i64> = BTreeMap::new();
    for mop in &txn.mops {
        match *mop {
            Mop::ReadRegister { key, value: Some(value) } => {
                if let Some(&expected) = seen.get(&key) {
                    if expected != value {
                        inferred.direct.push(DirectAnomaly {
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
                read_of_version(t, key, v, txns, writer, inferred);
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

/// Transaction `t`'s first read of `key`, which saw `v`: a garbage, future, aborted (G1a) or
/// intermediate (G1b) read is a direct anomaly; otherwise (G1b included) it depends on the
/// writer, which counts as committed if its outcome was unknown.
fn read_of_version(
    t: u32,
    key: u32,
    v: i64,
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    inferred: &mut Inferred,
) {
    match writer.get(&(key, v)) {
        None => inferred.direct.push(DirectAnomaly {
            class: "garbage-read",
            txns: vec![t],
            key,
            detail: format!("read {v}, which no transaction wrote"),
        }),
        Some(w) if w.txn == t => {
            // Not written before (the key was not accessed), so later.
            inferred.direct.push(DirectAnomaly {
                class: "future-read",
                txns: vec![t],
                key,
                detail: format!("read {v}, which it writes later"),
            });
        }
        Some(w) => {
            let status = txns[w.txn as usize].status;
            if status == Status::Fail {
                inferred.direct.push(DirectAnomaly {
                    class: "G1a",
                    txns: vec![t, w.txn],
                    key,
                    detail: format!("read {v}, written by an aborted transaction"),
                });
                return;
            }
            if !w.last_to_key && w.txn != t {
                inferred.direct.push(DirectAnomaly {
                    class: "G1b",
                    txns: vec![t, w.txn],
                    key,
                    detail: format!("read {v}, an intermediate write of its writer"),
                });
            }
            if status == Status::Info {
                inferred.committed[w.txn as usize] = true;
            }
            inferred.graph.add(w.txn, t, EdgeKind::Wr, key);
        }
    }
}

/// Each known adjacency of a key's version order: the earlier version's writer precedes the
/// later's (ww), and the earlier version's readers anti-depend on it (rw).
fn follows_edges(
    follows: &[(u32, Option<i64>, i64)],
    writer: &FixedHashMap<(u32, i64), Writer>,
    readers: &RegisterReaders,
    graph: &mut Graph,
) {
    for &(key, before, after) in follows {
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
}

/// The initial state precedes every write: readers of it anti-depend on every writer (up to
/// [`INITIAL_READ_EDGES_PER_KEY_MAX`] edges per key).
fn initial_read_edges(
    txns: &[Txn],
    writer: &FixedHashMap<(u32, i64), Writer>,
    readers: &RegisterReaders,
    graph: &mut Graph,
) {
    let mut key_writers: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&(key, _), w) in writer.iter() {
        if w.last_to_key && txns[w.txn as usize].status != Status::Fail {
            key_writers.entry(key).or_default().push(w.txn);
        }
    }
    for (&(key, value), rs) in readers {
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
