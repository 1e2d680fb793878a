//! Meridian's history checker: reads a transaction history (elle-cli JSON, list-append or
//! rw-register), infers write-write, write-read and read-write dependencies and, for strict
//! serializability, real-time order, then reports every anomaly by Adya class with the
//! smallest cycle found as evidence (docs/design.md, "Correctness").
//!
//! Contract: [`check`] never panics on any [`History`] that [`History::parse`] accepted, and a
//! report is `valid` only when no anomaly of a class the chosen consistency model forbids was
//! found. Cycle classes: G0 (ww only), G1c (ww and wr), G-single (exactly one rw), G2 (two or
//! more rw), each with a `-realtime` variant when the cycle needs a real-time edge (forbidden
//! only under strict serializability). Direct classes: G1a (aborted read), G1b (intermediate
//! read), dirty update (a committed append on top of an aborted one), future read (a read of
//! the transaction's own later write), internal inconsistency, incompatible version orders,
//! garbage reads and duplicated list elements.

pub mod graph;
pub mod history;
pub mod infer;

use graph::{EdgeKind, Graph, Step};
use history::{History, HistoryError, Model, Status, Txn};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Anomalies listed per class in a report; the rest are counted.
pub const ANOMALIES_SHOWN_PER_CLASS_MAX: usize = 4;

/// The consistency model a history is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Some serial order explains every committed transaction.
    Serializable,
    /// ... and that order respects real time.
    StrictSerializable,
}

impl Consistency {
    /// Parses a model name.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "serializable" => Ok(Self::Serializable),
            "strict-serializable" => Ok(Self::StrictSerializable),
            other => Err(format!(
                "unknown consistency model '{other}'; accepted: serializable, strict-serializable"
            )),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Serializable => "serializable",
            Self::StrictSerializable => "strict-serializable",
        }
    }
}

/// One anomaly with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anomaly {
    /// Class name: `G0`, `G1a`, `G1b`, `G1c`, `G-single`, `G2`, a `-realtime` variant, or a
    /// direct class (`dirty-update`, `future-read`, `internal`, `incompatible-order`,
    /// `garbage-read`, `duplicate-elements`).
    pub class: String,
    /// Human-readable evidence.
    pub explanation: String,
    /// Transactions involved (numbers as in [`History::transactions`]).
    pub txns: Vec<u32>,
    /// For cycles: the steps, in order.
    pub cycle: Vec<Step>,
}

/// The verdict on one history.
#[derive(Clone, Debug)]
pub struct Report {
    /// The history model.
    pub model: Model,
    /// The consistency model checked.
    pub consistency: Consistency,
    /// True when no forbidden anomaly was found.
    pub valid: bool,
    /// Transactions by outcome: ok, fail, info.
    pub txns: [u64; 3],
    /// Edges by kind: ww, wr, rw, realtime.
    pub edges: [u64; 4],
    /// Anomalies found (every class, forbidden or not).
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// Classes found, each once, in order.
    pub fn classes(&self) -> Vec<&str> {
        let set: BTreeSet<&str> = self.anomalies.iter().map(|a| a.class.as_str()).collect();
        set.into_iter().collect()
    }

    /// A multi-line summary: the verdict, counts, and the evidence per class.
    pub fn render(&self, history: &History, txns: &[Txn]) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "{}: {} history, {} ok, {} failed, {} unknown; edges ww {} wr {} rw {} realtime {}",
            if self.valid {
                format!("VALID ({})", self.consistency.name())
            } else {
                format!("INVALID ({})", self.consistency.name())
            },
            self.model.name(),
            self.txns[0],
            self.txns[1],
            self.txns[2],
            self.edges[0],
            self.edges[1],
            self.edges[2],
            self.edges[3],
        );
        for class in self.classes() {
            let of_class: Vec<_> = self.anomalies.iter().filter(|a| a.class == class).collect();
            let _ = writeln!(text, "{class}: {} found", of_class.len());
            for anomaly in of_class.iter().take(ANOMALIES_SHOWN_PER_CLASS_MAX) {
                let _ = writeln!(text, "  {}", anomaly.explanation);
                for step in &anomaly.cycle {
                    let key = match step.edge.kind {
                        EdgeKind::Realtime => String::new(),
                        _ => format!(" on key {}", history.keys[step.edge.key as usize]),
                    };
                    let _ = writeln!(
                        text,
                        "    {} -{}{}-> {}",
                        describe(txns, step.from),
                        step.edge.kind.name(),
                        key,
                        describe(txns, step.edge.to)
                    );
                }
            }
        }
        text
    }
}

/// "T12 (process 3, index 40)".
pub fn describe(txns: &[Txn], t: u32) -> String {
    let txn = &txns[t as usize];
    format!("T{t} (process {}, index {})", txn.process, txn.invoke_index)
}

/// Checks a history.
pub fn check(
    history: &History,
    model: Model,
    consistency: Consistency,
) -> Result<(Report, Vec<Txn>), HistoryError> {
    let txns = history.transactions()?;
    let inferred = match model {
        Model::ListAppend => infer::list_append(&txns),
        Model::RwRegister => {
            infer::rw_register(&txns, consistency == Consistency::StrictSerializable)
        }
    }
    .map_err(|message| HistoryError { line: None, message })?;
    let mut graph = inferred.graph.restricted(&inferred.committed);
    if consistency == Consistency::StrictSerializable {
        add_realtime_edges(&mut graph, &txns, &inferred.committed);
    }
    let mut anomalies: Vec<Anomaly> = inferred
        .direct
        .iter()
        .map(|d| Anomaly {
            class: d.class.to_string(),
            explanation: format!(
                "{} on key {}: {} ({})",
                d.class,
                history.keys[d.key as usize],
                d.detail,
                d.txns.iter().map(|&t| describe(&txns, t)).collect::<Vec<_>>().join(", ")
            ),
            txns: d.txns.clone(),
            cycle: Vec::new(),
        })
        .collect();
    anomalies.extend(cycle_anomalies(&graph));
    let valid = anomalies
        .iter()
        .all(|a| consistency == Consistency::Serializable && a.class.ends_with("-realtime"));
    let mut counts = [0u64; 3];
    for txn in &txns {
        counts[match txn.status {
            Status::Ok => 0,
            Status::Fail => 1,
            Status::Info => 2,
        }] += 1;
    }
    let report =
        Report { model, consistency, valid, txns: counts, edges: graph.edge_counts(), anomalies };
    Ok((report, txns))
}

/// Real-time edges: T1 -> T2 when T1 completed before T2 was invoked, transitively reduced
/// through a frontier of completed transactions not yet followed by a later one. When every
/// operation carries a time, times decide and equal times are concurrent; otherwise the order
/// of the history does. Transactions of unknown outcome may have taken effect at any time
/// after their invocation, so they get edges in but none out.
fn add_realtime_edges(graph: &mut Graph, txns: &[Txn], committed: &[bool]) {
    let timed = txns.iter().all(|t| {
        t.invoke_time.is_some() && (t.complete_pos.is_none() || t.complete_time.is_some())
    });
    // (instant, is_completion, txn): at equal instants invocations come first.
    let mut events: Vec<(u64, bool, u32)> = Vec::new();
    for (t, txn) in txns.iter().enumerate().filter(|(t, _)| committed[*t]) {
        let invoked = if timed { txn.invoke_time.unwrap_or(0) } else { txn.invoke_pos as u64 };
        events.push((invoked, false, t as u32));
        if let (Status::Ok, Some(pos)) = (txn.status, txn.complete_pos) {
            let completed = if timed { txn.complete_time.unwrap_or(0) } else { pos as u64 };
            events.push((completed, true, t as u32));
        }
    }
    events.sort_unstable();
    let mut frontier: BTreeSet<u32> = BTreeSet::new();
    let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); txns.len()];
    for (_, is_completion, t) in events {
        if is_completion {
            for p in std::mem::take(&mut predecessors[t as usize]) {
                frontier.remove(&p);
            }
            frontier.insert(t);
        } else {
            for &f in &frontier {
                graph.add(f, t, EdgeKind::Realtime, 0);
            }
            predecessors[t as usize] = frontier.iter().copied().collect();
        }
    }
}

/// The Adya class of a cycle, from the kinds of its edges.
pub fn classify(cycle: &[Step]) -> String {
    let rw = cycle.iter().filter(|s| s.edge.kind == EdgeKind::Rw).count();
    let wr = cycle.iter().any(|s| s.edge.kind == EdgeKind::Wr);
    let realtime = cycle.iter().any(|s| s.edge.kind == EdgeKind::Realtime);
    let base = match (rw, wr) {
        (0, false) => "G0",
        (0, true) => "G1c",
        (1, _) => "G-single",
        _ => "G2",
    };
    if realtime {
        format!("{base}-realtime")
    } else {
        base.to_string()
    }
}

/// Finds the strongly connected components and, in each, a smallest cycle of the most severe
/// class present (searching without real-time edges first).
fn cycle_anomalies(graph: &Graph) -> Vec<Anomaly> {
    use EdgeKind::{Realtime, Rw, Wr, Ww};
    let searches: [(&[EdgeKind], bool); 8] = [
        (&[Ww], false),
        (&[Ww, Wr], false),
        (&[Ww, Wr, Rw], true),
        (&[Ww, Wr, Rw], false),
        (&[Ww, Realtime], false),
        (&[Ww, Wr, Realtime], false),
        (&[Ww, Wr, Rw, Realtime], true),
        (&[Ww, Wr, Rw, Realtime], false),
    ];
    let mut anomalies = Vec::new();
    for component in graph.cycles_components() {
        for (allowed, one_rw) in searches {
            if let Some(cycle) = graph.smallest_cycle(&component, allowed, one_rw) {
                let class = classify(&cycle);
                let explanation = format!(
                    "{class}: a cycle of {} transactions in a strongly connected component of {}",
                    cycle.len(),
                    component.len()
                );
                anomalies.push(Anomaly {
                    class,
                    explanation,
                    txns: cycle.iter().map(|s| s.from).collect(),
                    cycle,
                });
                break;
            }
        }
    }
    anomalies
}
