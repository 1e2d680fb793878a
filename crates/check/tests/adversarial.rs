//! Adversarial histories: small histories recorded from a simulated serializable store (a few
//! keys, up to six transactions, concurrent clients, failed and unknown outcomes, nemesis
//! operations), then mutated the way a broken store would lie: a read loses an element, shows
//! two in the wrong order, shows its own later append or write, or an applied transaction is
//! reported failed. A brute-force oracle decides each result by trying every serial order of
//! every set of transactions that may have committed. For list-append the checker must agree
//! with it exactly, under both consistency models; for rw-register, whose version order is only
//! partly known (as in Elle), every anomaly the checker reports must be real, and the misses
//! are counted.

use meridian_check::history::{History, Model};
use meridian_check::{check, Consistency};
use meridian_core::rng::{chance, child_rng, uniform_u64, Rng};
use std::collections::BTreeMap;

/// Seeds per model; each gives one valid history and up to four mutations of it.
const SEEDS: u64 = 1000;
/// Transactions per history at most: the oracle tries every order (6! = 720) of every set of
/// transactions with an unknown outcome.
const TXNS_MAX: u64 = 6;

/// Seeds and transactions per history for the sweep of larger valid histories.
const LARGE_SEEDS: u64 = 40;
const LARGE_TXNS_MAX: u64 = 400;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Mop {
    Append(u32, i64),
    Write(u32, i64),
    ReadList(u32, Vec<i64>),
    ReadRegister(u32, Option<i64>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Fail,
    /// `info` completion with the invocation's value.
    Info,
    /// `info` completion with a `null` value.
    InfoNull,
    /// Never completed.
    Open,
}

#[derive(Clone, Debug)]
struct Txn {
    mops: Vec<Mop>,
    outcome: Outcome,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Invoke(usize),
    Complete(usize),
    Nemesis,
}

#[derive(Clone, Debug)]
struct Generated {
    txns: Vec<Txn>,
    events: Vec<Event>,
}

fn pick(rng: &mut Rng, n: usize) -> usize {
    uniform_u64(rng, n as u64) as usize
}

/// A history of a serializable store: each transaction is invoked, applied atomically at one
/// instant (unless it failed, or maybe when its outcome is unknown), and completed, with the
/// steps of different transactions interleaved at random. Applying at one instant between
/// invocation and completion makes the history strict serializable too.
fn generate(model: Model, seed: u64, txns_max: u64) -> Generated {
    let mut rng = child_rng(seed, "adversarial-history", model as u64);
    let keys = 2 + uniform_u64(&mut rng, 2) as u32;
    let count = 2 + uniform_u64(&mut rng, txns_max - 1) as usize;
    let mut next_value: BTreeMap<u32, i64> = BTreeMap::new();
    let mut txns = Vec::new();
    // Per transaction: its remaining steps (0 invoke, 1 apply, 2 complete), in order.
    let mut steps: Vec<Vec<u8>> = Vec::new();
    for _ in 0..count {
        let mut mops = Vec::new();
        for _ in 0..1 + uniform_u64(&mut rng, 4) {
            let key = uniform_u64(&mut rng, u64::from(keys)) as u32;
            let read = chance(&mut rng, 0.5);
            let value = next_value.entry(key).or_insert(1);
            mops.push(match (model, read) {
                (Model::ListAppend, true) => Mop::ReadList(key, Vec::new()),
                (Model::RwRegister, true) => Mop::ReadRegister(key, None),
                (Model::ListAppend, false) => Mop::Append(key, *value),
                (Model::RwRegister, false) => Mop::Write(key, *value),
            });
            if !read {
                *value += 1;
            }
        }
        let outcome = match uniform_u64(&mut rng, 20) {
            0 | 1 => Outcome::Fail,
            2 => Outcome::Info,
            3 => Outcome::InfoNull,
            4 => Outcome::Open,
            _ => Outcome::Ok,
        };
        let applied = match outcome {
            Outcome::Ok => true,
            Outcome::Fail => false,
            _ => chance(&mut rng, 0.5),
        };
        // An unknown outcome may take effect after the client gave up on it.
        let mut order = match (applied, outcome) {
            (false, _) => vec![0, 2],
            (true, Outcome::Info | Outcome::InfoNull) if chance(&mut rng, 0.5) => vec![0, 2, 1],
            (true, _) => vec![0, 1, 2],
        };
        if outcome == Outcome::Open {
            order.retain(|&s| s != 2);
        }
        order.reverse();
        steps.push(order);
        txns.push(Txn { mops, outcome });
    }
    let mut lists: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    let mut registers: BTreeMap<u32, i64> = BTreeMap::new();
    let mut events = Vec::new();
    while steps.iter().any(|s| !s.is_empty()) {
        if chance(&mut rng, 0.1) {
            events.push(Event::Nemesis);
        }
        let ready: Vec<usize> = (0..count).filter(|&t| !steps[t].is_empty()).collect();
        let t = ready[pick(&mut rng, ready.len())];
        match steps[t].pop() {
            Some(0) => events.push(Event::Invoke(t)),
            Some(2) => events.push(Event::Complete(t)),
            _ => {
                for mop in &mut txns[t].mops {
                    match mop {
                        Mop::Append(k, v) => lists.entry(*k).or_default().push(*v),
                        Mop::Write(k, v) => {
                            registers.insert(*k, *v);
                        }
                        Mop::ReadList(k, list) => *list = lists.get(k).cloned().unwrap_or_default(),
                        Mop::ReadRegister(k, value) => *value = registers.get(k).copied(),
                    }
                }
            }
        }
    }
    Generated { txns, events }
}

fn mop_json(mop: &Mop, with_reads: bool) -> String {
    match mop {
        Mop::Append(k, v) => format!(r#"["append",{k},{v}]"#),
        Mop::Write(k, v) => format!(r#"["w",{k},{v}]"#),
        Mop::ReadList(k, _) | Mop::ReadRegister(k, _) if !with_reads => {
            format!(r#"["r",{k},null]"#)
        }
        Mop::ReadList(k, list) => format!(r#"["r",{k},{list:?}]"#),
        Mop::ReadRegister(k, None) => format!(r#"["r",{k},null]"#),
        Mop::ReadRegister(k, Some(v)) => format!(r#"["r",{k},{v}]"#),
    }
}

/// elle-cli JSON, one operation per line, and each transaction's (invocation, completion)
/// positions.
fn render(generated: &Generated) -> (String, Vec<(usize, Option<usize>)>) {
    let mut lines = Vec::new();
    let mut positions = vec![(0, None); generated.txns.len()];
    for event in &generated.events {
        let index = lines.len();
        let line = match *event {
            Event::Nemesis => format!(
                r#"{{"index":{index},"process":"nemesis","type":"info","f":"kill","value":{}}}"#,
                if index % 2 == 0 { "null" } else { r#"["n1"]"# }
            ),
            Event::Invoke(t) | Event::Complete(t) => {
                let txn = &generated.txns[t];
                let invoke = matches!(event, Event::Invoke(_));
                let kind = match (invoke, txn.outcome) {
                    (true, _) => "invoke",
                    (false, Outcome::Ok) => "ok",
                    (false, Outcome::Fail) => "fail",
                    (false, _) => "info",
                };
                let value = if !invoke && txn.outcome == Outcome::InfoNull {
                    "null".to_string()
                } else {
                    let reads = !invoke && txn.outcome == Outcome::Ok;
                    let mops: Vec<String> = txn.mops.iter().map(|m| mop_json(m, reads)).collect();
                    format!("[{}]", mops.join(","))
                };
                if invoke {
                    positions[t].0 = index;
                } else {
                    positions[t].1 = Some(index);
                }
                format!(
                    r#"{{"index":{index},"process":{t},"type":"{kind}","f":"txn","value":{value}}}"#
                )
            }
        };
        lines.push(line);
    }
    (lines.join("\n"), positions)
}

/// Whether some serial order of some set of transactions that may have committed (every `ok`
/// one, any of those with unknown outcome, no failed one) replays every `ok` read; with
/// `strict`, the order must also put a transaction that completed before another's invocation
/// first.
fn serializable(generated: &Generated, strict: bool) -> bool {
    let (_, positions) = render(generated);
    let txns = &generated.txns;
    let optional: Vec<usize> = (0..txns.len())
        .filter(|&t| matches!(txns[t].outcome, Outcome::Info | Outcome::InfoNull | Outcome::Open))
        .collect();
    for subset in 0..1u32 << optional.len() {
        let chosen: Vec<usize> = (0..txns.len())
            .filter(|&t| {
                txns[t].outcome == Outcome::Ok
                    || optional.iter().position(|&o| o == t).is_some_and(|i| subset & 1 << i != 0)
            })
            .collect();
        let before = |a: usize, b: usize| {
            strict
                && txns[a].outcome == Outcome::Ok
                && positions[a].1.is_some_and(|done| done < positions[b].0)
        };
        if serial_order_exists(txns, &chosen, &before, 0, &State::default()) {
            return true;
        }
    }
    false
}

#[derive(Clone, Default)]
struct State {
    lists: BTreeMap<u32, Vec<i64>>,
    registers: BTreeMap<u32, i64>,
}

/// Depth-first over the orders of `chosen` (`placed` is a bit set over its positions).
fn serial_order_exists(
    txns: &[Txn],
    chosen: &[usize],
    before: &dyn Fn(usize, usize) -> bool,
    placed: u32,
    state: &State,
) -> bool {
    if placed == (1u32 << chosen.len()) - 1 {
        return true;
    }
    'next: for (i, &t) in chosen.iter().enumerate() {
        if placed & 1 << i != 0 {
            continue;
        }
        for (j, &u) in chosen.iter().enumerate() {
            if placed & 1 << j == 0 && u != t && before(u, t) {
                continue 'next;
            }
        }
        let mut after = state.clone();
        let checked = txns[t].outcome == Outcome::Ok;
        for mop in &txns[t].mops {
            let consistent = match mop {
                Mop::Append(k, v) => {
                    after.lists.entry(*k).or_default().push(*v);
                    true
                }
                Mop::Write(k, v) => {
                    after.registers.insert(*k, *v);
                    true
                }
                Mop::ReadList(k, list) => {
                    !checked || after.lists.get(k).map_or(&[][..], Vec::as_slice) == list
                }
                Mop::ReadRegister(k, value) => !checked || after.registers.get(k) == value.as_ref(),
            };
            if !consistent {
                continue 'next;
            }
        }
        if serial_order_exists(txns, chosen, before, placed | 1 << i, &after) {
            return true;
        }
    }
    false
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mutation {
    DropElement,
    SwapElements,
    FailWriter,
    FutureRead,
    ChangeRead,
}

/// Applies `mutation` at a random place it fits; `None` when it fits nowhere.
fn mutate(generated: &Generated, mutation: Mutation, rng: &mut Rng) -> Option<Generated> {
    let mut out = generated.clone();
    let ok: Vec<usize> =
        (0..out.txns.len()).filter(|&t| out.txns[t].outcome == Outcome::Ok).collect();
    // (txn, mop) places where the mutation applies.
    let mut places = Vec::new();
    for &t in &ok {
        let mops = &out.txns[t].mops;
        for (i, mop) in mops.iter().enumerate() {
            let fits = match (mutation, mop) {
                (Mutation::DropElement, Mop::ReadList(_, list)) => !list.is_empty(),
                (Mutation::SwapElements, Mop::ReadList(_, list)) => list.len() >= 2,
                (Mutation::FailWriter, Mop::Append(..) | Mop::Write(..)) => true,
                (Mutation::FutureRead, Mop::ReadList(k, _) | Mop::ReadRegister(k, _)) => mops
                    [i + 1..]
                    .iter()
                    .any(|m| matches!(m, Mop::Append(j, _) | Mop::Write(j, _) if j == k)),
                (Mutation::ChangeRead, Mop::ReadRegister(..)) => true,
                _ => false,
            };
            if fits {
                places.push((t, i));
            }
        }
    }
    if places.is_empty() {
        return None;
    }
    let (t, i) = places[pick(rng, places.len())];
    let later: Vec<i64> = out.txns[t].mops[i + 1..]
        .iter()
        .filter_map(|m| match m {
            Mop::Append(k, v) | Mop::Write(k, v) if *k == out.txns[t].mops[i].key() => Some(*v),
            _ => None,
        })
        .collect();
    let written: Vec<i64> = generated
        .txns
        .iter()
        .flat_map(|txn| &txn.mops)
        .filter_map(|m| match m {
            Mop::Write(k, v) if *k == out.txns[t].mops[i].key() => Some(*v),
            _ => None,
        })
        .collect();
    let txn = &mut out.txns[t];
    match (mutation, &mut txn.mops[i]) {
        (Mutation::DropElement, Mop::ReadList(_, list)) => {
            list.remove(pick(rng, list.len()));
        }
        (Mutation::SwapElements, Mop::ReadList(_, list)) => {
            let a = pick(rng, list.len());
            let b = (a + 1 + pick(rng, list.len() - 1)) % list.len();
            list.swap(a, b);
        }
        (Mutation::FailWriter, _) => txn.outcome = Outcome::Fail,
        (Mutation::FutureRead, Mop::ReadList(_, list)) => {
            let at = pick(rng, list.len() + 1);
            list.insert(at, later[pick(rng, later.len())]);
        }
        (Mutation::FutureRead, Mop::ReadRegister(_, value)) => {
            *value = Some(later[pick(rng, later.len())]);
        }
        (Mutation::ChangeRead, Mop::ReadRegister(_, value)) => {
            // Another value written to the key, or the initial state.
            let others: Vec<Option<i64>> =
                written.iter().map(|&v| Some(v)).chain([None]).filter(|v| v != value).collect();
            if others.is_empty() {
                return None;
            }
            *value = others[pick(rng, others.len())];
        }
        _ => return None,
    }
    Some(out)
}

impl Mop {
    fn key(&self) -> u32 {
        match self {
            Mop::Append(k, _)
            | Mop::Write(k, _)
            | Mop::ReadList(k, _)
            | Mop::ReadRegister(k, _) => *k,
        }
    }
}

/// The checker's verdicts (serializable, strict) and the classes found under strict.
fn verdicts(model: Model, text: &str) -> ([bool; 2], Vec<String>) {
    let history = History::parse(text, model)
        .unwrap_or_else(|e| panic!("a generated history parses: {e}\n{text}"));
    let mut valid = [false; 2];
    let mut classes = Vec::new();
    for (i, consistency) in
        [Consistency::Serializable, Consistency::StrictSerializable].into_iter().enumerate()
    {
        let (report, _) = check(&history, model, consistency)
            .unwrap_or_else(|e| panic!("a generated history is checkable: {e}\n{text}"));
        valid[i] = report.valid;
        classes = report.classes().iter().map(|c| c.to_string()).collect();
    }
    (valid, classes)
}

/// Per mutation: applied, not serializable, not strict serializable, and the violations the
/// checker missed under each model.
type Tally = BTreeMap<Mutation, [u32; 5]>;

fn run(model: Model, mutations: &[Mutation], exact: bool) -> Tally {
    let mut tally = Tally::new();
    for seed in 0..SEEDS {
        let base = generate(model, seed, TXNS_MAX);
        let (text, _) = render(&base);
        let (valid, classes) = verdicts(model, &text);
        assert!(serializable(&base, true), "seed {seed}: the generator is strict serializable");
        assert_eq!(
            valid,
            [true, true],
            "seed {seed}: a recorded history passes: {classes:?}\n{text}"
        );
        let mut rng = child_rng(seed, "adversarial-mutation", model as u64);
        for &mutation in mutations {
            let Some(mutated) = mutate(&base, mutation, &mut rng) else { continue };
            let (text, _) = render(&mutated);
            let oracle = [serializable(&mutated, false), serializable(&mutated, true)];
            let (checker, classes) = verdicts(model, &text);
            let context = || {
                format!(
                    "seed {seed}, {mutation:?}: oracle (serializable, strict) {oracle:?}, \
                     checker {checker:?} {classes:?}\n{text}"
                )
            };
            let entry = tally.entry(mutation).or_default();
            entry[0] += 1;
            for i in 0..2 {
                assert!(!oracle[i] || checker[i], "flagged a valid history: {}", context());
                if exact {
                    assert!(oracle[i] || !checker[i], "missed a violation: {}", context());
                }
                entry[1 + i] += u32::from(!oracle[i]);
                entry[3 + i] += u32::from(!oracle[i] && checker[i]);
            }
        }
    }
    eprintln!(
        "{} seeds of {}: per mutation [applied, not serializable, not strict serializable, \
         missed serializable, missed strict]: {tally:?}",
        SEEDS,
        model.name()
    );
    tally
}

#[test]
fn list_append_verdicts_match_brute_force_exactly() {
    use Mutation::{DropElement, FailWriter, FutureRead, SwapElements};
    let tally = run(Model::ListAppend, &[DropElement, SwapElements, FailWriter, FutureRead], true);
    // The test has teeth: every mutation kind was applied, and most results are violations.
    for mutation in [DropElement, SwapElements, FailWriter, FutureRead] {
        let [applied, not_serializable, ..] = tally.get(&mutation).copied().unwrap_or_default();
        assert!(applied >= 50 && not_serializable >= applied / 3, "{mutation:?}: {tally:?}");
    }
}

#[test]
fn rw_register_anomalies_are_real() {
    use Mutation::{ChangeRead, FailWriter, FutureRead};
    let tally = run(Model::RwRegister, &[ChangeRead, FailWriter, FutureRead], false);
    for mutation in [ChangeRead, FailWriter, FutureRead] {
        let [applied, not_serializable, ..] = tally.get(&mutation).copied().unwrap_or_default();
        assert!(applied >= 50 && not_serializable >= applied / 4, "{mutation:?}: {tally:?}");
    }
}

#[test]
fn larger_recorded_histories_stay_valid() {
    // Too large for the oracle, but serializable by construction: no false alarms, with
    // hundreds of concurrent transactions over a few keys.
    for model in [Model::ListAppend, Model::RwRegister] {
        for seed in 0..LARGE_SEEDS {
            let (text, _) = render(&generate(model, seed, LARGE_TXNS_MAX));
            let (valid, classes) = verdicts(model, &text);
            assert_eq!(valid, [true, true], "seed {seed}: {classes:?}\n{text}");
        }
    }
}
