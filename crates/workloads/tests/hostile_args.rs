//! Every procedure of every workload, fed arguments and dependency outputs that no generator
//! would produce (mutated from real ones, or random; both come from the wire) and arbitrary
//! stored values, must answer with an error or a user abort, never panic. Procedures run inside a shard's replicated state machine (a
//! single-shard commit executes there), so a panic on hostile input would repeat on every
//! replica and every restart: a hostile client must cost one request, never a shard.

use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{Datum, KeySet, PieceOutput, PlanContext, Reads};
use meridian_core::RequestId;
use meridian_workloads::{build, WorkloadOptions, WORKLOADS};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Mutated requests per workload.
const CASES: u64 = 400;

fn random_datum(rng: &mut Rng, depth: u32) -> Datum {
    match uniform_u64(rng, if depth >= 3 { 3 } else { 4 }) {
        0 => Datum::Int([0, -1, i64::MIN, i64::MAX, 7][uniform_u64(rng, 5) as usize]),
        1 => Datum::Uint([0, 1, u64::MAX, 1 << 40, 3][uniform_u64(rng, 5) as usize]),
        2 => Datum::Bytes((0..uniform_u64(rng, 40)).map(|_| uniform_u64(rng, 256) as u8).collect()),
        _ => Datum::List((0..uniform_u64(rng, 5)).map(|_| random_datum(rng, depth + 1)).collect()),
    }
}

/// One structural change somewhere in `data`.
fn mutate(rng: &mut Rng, data: &mut Vec<Datum>, depth: u32) {
    if data.is_empty() || uniform_u64(rng, 6) == 0 {
        data.push(random_datum(rng, depth));
        return;
    }
    let at = uniform_u64(rng, data.len() as u64) as usize;
    match uniform_u64(rng, 5) {
        0 => {
            data.remove(at);
        }
        1 => data[at] = random_datum(rng, depth),
        2 => {
            if let Datum::List(items) = &mut data[at] {
                mutate(rng, items, depth + 1);
            } else {
                data[at] = Datum::List(vec![data[at].clone()]);
            }
        }
        3 => data.truncate(at),
        _ => {
            let copy = data[at].clone();
            data.push(copy);
        }
    }
}

/// Values of the declared reads' shape (the executor reads them from the declared keys: they
/// come from the store, which holds whatever was written, so they are arbitrary bytes).
fn random_values(rng: &mut Rng, keys: &KeySet) -> Vec<Option<Vec<u8>>> {
    (0..keys.reads.len())
        .map(|_| match uniform_u64(rng, 3) {
            0 => None,
            _ => Some((0..uniform_u64(rng, 24)).map(|_| uniform_u64(rng, 256) as u8).collect()),
        })
        .collect()
}

/// Reads of the declared shape over `values` (from [`random_values`]).
fn random_reads<'a>(rng: &mut Rng, keys: &KeySet, values: &'a [Option<Vec<u8>>]) -> Reads<'a> {
    let values = values.iter().map(|v| v.as_deref()).collect();
    let scans = (0..keys.scans.len())
        .map(|_| {
            (0..uniform_u64(rng, 4))
                .map(|i| (Key::table(1).u64(i).build(), vec![uniform_u64(rng, 256) as u8; 3]))
                .collect()
        })
        .collect();
    Reads { values, scans }
}

#[test]
fn no_procedure_panics_on_hostile_arguments_inputs_or_reads() {
    let mut failures = Vec::new();
    let mut executed = 0u64;
    for name in WORKLOADS {
        let mut options =
            WorkloadOptions { shards: 2, keys_per_shard: 1_000, ..Default::default() };
        if name == "tpcc" {
            options.tpcc = meridian_workloads::tpcc::TpccOptions::from_flags(
                None,
                None,
                None,
                None,
                Some("small"),
            )
            .unwrap();
        }
        let workload = build(name, &options).unwrap();
        let registry = workload.registry();
        let partitioner = workload.partitioner();
        let context = PlanContext { partitioner: &partitioner };
        let mut generator = workload.generator(0, 5);
        let mut rng = child_rng(11, "hostile-args", name.len() as u64);
        for case in 0..CASES {
            let mut txn = generator.next(RequestId(case + 1));
            // Half the cases keep the arguments and attack the dependency outputs only.
            if case % 2 == 0 {
                for _ in 0..1 + uniform_u64(&mut rng, 2) {
                    mutate(&mut rng, &mut txn.args, 0);
                }
            }
            let Some(procedure) = registry.get(txn.proc) else { continue };
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                // Run the plan in order: each piece gets its dependencies' outputs (from
                // arbitrary stored values), mutated half the time; past the end, junk.
                let plan = procedure.plan(&txn.args, context).unwrap_or_default();
                let mut outputs: Vec<PieceOutput> = Vec::new();
                for piece in 0..plan.len() as u32 + 2 {
                    let mut inputs: Vec<PieceOutput> = match plan.get(piece as usize) {
                        Some(spec) => spec
                            .deps
                            .iter()
                            .map(|&d| outputs.get(d as usize).cloned().unwrap_or_default())
                            .collect(),
                        None => vec![vec![random_datum(&mut rng, 1)]],
                    };
                    if uniform_u64(&mut rng, 2) == 0 {
                        if let Some(input) = inputs.first_mut() {
                            mutate(&mut rng, input, 1);
                        }
                    }
                    let refs: Vec<&PieceOutput> = inputs.iter().collect();
                    // A piece whose keys are refused never runs.
                    let mut output = Vec::new();
                    if let Ok(keys) = procedure.keys(piece, &txn.args, &refs) {
                        let values = random_values(&mut rng, &keys);
                        let reads = random_reads(&mut rng, &keys, &values);
                        if let Ok(effects) = procedure.execute(piece, &txn.args, &refs, &reads) {
                            output = effects.output;
                        }
                        executed += 1;
                    }
                    outputs.push(output);
                }
            }));
            if outcome.is_err() {
                failures.push(format!("{name}/{}: args {:?}", procedure.name(), txn.args));
            }
        }
    }
    // The mutations must leave many requests runnable, or this test would prove nothing.
    assert!(executed > WORKLOADS.len() as u64 * CASES / 2, "only {executed} pieces ran");
    assert!(failures.is_empty(), "{} panics, first: {:?}", failures.len(), failures.first());
}
