//! The script runner the node fuzz targets share: a cluster of one protocol's nodes runs real
//! workload transactions while arbitrary decoded messages arrive at its nodes from any sender,
//! members and strangers alike. The input is a script: each step either submits a workload
//! transaction, injects a message decoded from the input, or lets time pass (firing due
//! timers and delivering what the nodes sent). No handler may panic, whatever arrives; debug
//! assertions are on in fuzz builds, so an invariant a message can break is a finding too.

use meridian_core::node::{ClientRequest, Effect, Node, Outbox, PersistToken, TimerId};
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, RequestId, Time};
use meridian_protocols::{NodeContext, ProtocolNode, Timing};
use meridian_workloads::Workload;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Script steps per input.
const STEPS_MAX: usize = 64;
/// Deliveries and timer firings per step.
const EVENTS_PER_STEP_MAX: usize = 2_000;

/// A cluster of 3 shards × `replicas` in 3 regions running `workload` (`smallbank`, 4 keys per
/// shard), each node built by `make` and loaded.
pub fn cluster<N: ProtocolNode>(
    replicas: u32,
    make: impl Fn(NodeContext) -> N,
) -> (Vec<N>, Box<dyn Workload>) {
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 4,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("smallbank", &options).expect("a workload");
    let regions = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let topology = Arc::new(Topology::standard(regions, 3, replicas).expect("a topology"));
    let registry = Arc::new(workload.registry());
    let partitioner = Arc::new(workload.partitioner());
    let nodes = topology
        .node_ids()
        .map(|id| {
            let timing = Timing::for_network(NS_PER_MS);
            let context = NodeContext::new(
                id,
                topology.clone(),
                registry.clone(),
                partitioner.clone(),
                1,
                timing,
            );
            let mut node = make(context);
            for (shard, store) in node.stores_mut() {
                workload.load(shard, store);
            }
            node
        })
        .collect();
    (nodes, workload)
}

/// Runs the script `data` against `nodes` (loaded and not started), submitting `workload`'s
/// transactions.
#[allow(dead_code)] // Each target includes this file; some use only `run_script_with`.
pub fn run_script<N: Node>(data: &[u8], nodes: Vec<N>, workload: &dyn Workload) {
    run_script_with(data, nodes, workload, |_, _| {});
}

/// [`run_script`], with `adjust` applied to each decoded message before it reaches its node
/// (a protocol whose nodes drop messages of another view sets the node's own, so that the
/// fuzzer reaches past that check).
#[allow(dead_code)] // As for `run_script`.
pub fn run_script_with<N: Node>(
    data: &[u8],
    mut nodes: Vec<N>,
    workload: &dyn Workload,
    adjust: impl Fn(&N, &mut N::Msg),
) {
    let count = nodes.len();
    let mut generator = workload.generator(0, 1);
    let mut now: Time = 1_000 * NS_PER_MS;
    let mut mail: Mail<N::Msg> = VecDeque::new();
    let mut timers = Timers::new();
    // Persists complete at the next step of time, in order (a node whose sends wait for its
    // disk must see them complete, or it falls silent).
    let mut persists: Persists = VecDeque::new();
    let mut request = 0u64;
    for (index, node) in nodes.iter_mut().enumerate() {
        let mut out = Outbox::new();
        node.on_start(now, &mut out);
        collect(index, &mut out, now, &mut mail, &mut timers, &mut persists);
    }
    let mut rest = data;
    for _ in 0..STEPS_MAX {
        let Some((&op, tail)) = rest.split_first() else { break };
        rest = tail;
        match op % 4 {
            0 => {
                // A client's transaction at coordinator `op / 4`.
                let at = usize::from(op / 4) % count;
                let txn = generator.next(RequestId(request));
                let mut out = Outbox::new();
                nodes[at].submit(now, ClientRequest { id: RequestId(request), txn }, &mut out);
                request += 1;
                collect(at, &mut out, now, &mut mail, &mut timers, &mut persists);
            }
            1 => {
                // A decoded message, from anyone (strangers included), to one node.
                let Some((&route, tail)) = rest.split_first() else { break };
                let Ok((mut msg, tail)) = postcard::take_from_bytes::<N::Msg>(tail) else {
                    break;
                };
                rest = tail;
                let to = usize::from(route) % count;
                adjust(&nodes[to], &mut msg);
                let from = NodeId(u32::from(route >> 4) % (count as u32 + 3));
                let mut out = Outbox::new();
                nodes[to].on_message(now, from, msg, &mut out);
                collect(to, &mut out, now, &mut mail, &mut timers, &mut persists);
            }
            _ => {
                // Time passes: deliver what was sent, fire what came due.
                now += u64::from(op) * NS_PER_MS;
                for _ in 0..EVENTS_PER_STEP_MAX {
                    if let Some((at, token)) = persists.pop_front() {
                        let mut out = Outbox::new();
                        nodes[at].on_persisted(now, token, &mut out);
                        collect(at, &mut out, now, &mut mail, &mut timers, &mut persists);
                        continue;
                    }
                    if let Some((from, to, msg)) = mail.pop_front() {
                        let Some(node) = nodes.get_mut(to.0 as usize) else { continue };
                        let mut out = Outbox::new();
                        node.on_message(now, from, msg, &mut out);
                        collect(
                            to.0 as usize,
                            &mut out,
                            now,
                            &mut mail,
                            &mut timers,
                            &mut persists,
                        );
                        continue;
                    }
                    let Some((&(due, at, timer), _)) = timers.first_key_value() else { break };
                    if due > now {
                        break;
                    }
                    timers.pop_first();
                    let mut out = Outbox::new();
                    nodes[at].on_timer(now, TimerId(timer), &mut out);
                    collect(at, &mut out, now, &mut mail, &mut timers, &mut persists);
                }
            }
        }
    }
}

type Mail<M> = VecDeque<(NodeId, NodeId, M)>;
type Timers = BTreeMap<(Time, usize, u64), ()>;
type Persists = VecDeque<(usize, PersistToken)>;

/// Queues what node `from` sent, the timers it set and the persists it asked for.
fn collect<M>(
    from: usize,
    out: &mut Outbox<M>,
    now: Time,
    mail: &mut Mail<M>,
    timers: &mut Timers,
    persists: &mut Persists,
) {
    for effect in out.drain() {
        match effect {
            Effect::Send { to, msg } => mail.push_back((NodeId(from as u32), to, msg)),
            Effect::SetTimer { timer, after_ns } => {
                timers.insert((now.saturating_add(after_ns), from, timer.0), ());
            }
            Effect::Persist { token, .. } => persists.push_back((from, token)),
            _ => {}
        }
    }
}
