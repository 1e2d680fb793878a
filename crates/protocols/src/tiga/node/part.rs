//! A transaction's part on one shard, derived by each replica from the body alone (nothing
//! in a message is trusted beyond the arguments): the shard's pieces, the keys they declare,
//! and the check that a request is one-shot in the sense the hold queue needs.

use super::*;

/// A transaction's part on one shard, derived from its body.
#[derive(Clone, Debug)]
pub(super) struct Part {
    /// The shard's pieces, in plan order.
    pub(super) pieces: Vec<u32>,
    /// Per piece of `pieces`, the pieces whose outputs it takes (the plan's dependencies).
    pub(super) deps: Vec<Vec<u32>>,
    /// Sorted.
    pub(super) reads: Vec<Key>,
    /// Sorted. Holds the guards of `guarded` pieces.
    pub(super) writes: Vec<Key>,
    /// Pieces whose keys need their inputs, ordered by the keys their procedure names as
    /// guards ([`meridian_core::txn::Procedure::guard`]) instead: they may touch keys not
    /// declared here. Sorted.
    pub(super) guarded: Vec<u32>,
    /// Pieces of other shards whose outputs these pieces take, with the shard each runs on:
    /// that shard's leader's vote carries it, and the part runs once all are in. Sorted.
    pub(super) inputs: Vec<(u32, ShardId)>,
    /// Per other shard, the pieces here whose outputs its pieces take. Sorted.
    pub(super) feeds: BTreeMap<ShardId, Vec<u32>>,
}

/// A one-shot transaction's shape: per participant shard its pieces and keys.
#[derive(Clone, Debug)]
pub(super) struct Shape {
    pub(super) parts: BTreeMap<ShardId, Part>,
    pub(super) pieces_total: usize,
}

/// Binds `request`'s plan and checks that tiga can run it: every piece's keys known from the
/// arguments alone (a piece may take other pieces' outputs as values), or, for a piece whose
/// keys need its inputs, guard keys on its shard that stand for them
/// ([`meridian_core::txn::Procedure::guard`]); no scans, and no shards whose pieces wait for
/// each other's outputs in a cycle.
pub(super) fn shape_of(
    context: &NodeContext,
    request: &TxnRequest,
    home: ShardId,
) -> Result<Shape, ProcError> {
    let pieces = bind_plan(context, request, home)?;
    check_one_shot(&pieces)
        .map_err(|why| ProcError::Unsupported(format!("tiga and luigi: {why}")))?;
    let procedure = context.registry.get(request.proc).expect("bind_plan found it");
    let mut parts: BTreeMap<ShardId, Part> = BTreeMap::new();
    for (index, piece) in pieces.iter().enumerate() {
        // Keys from the arguments alone (the execution checks that the keys it uses are
        // these). A piece whose keys need its inputs cannot say them: it runs only where its
        // procedure names guard keys, which stand for them here.
        let mut guarded = false;
        let keys = match procedure.keys(index as u32, &request.args, &[]) {
            Ok(keys) => keys,
            Err(error) if !piece.deps.is_empty() => {
                let Some(guard) = procedure.guard(index as u32, &request.args) else {
                    return Err(ProcError::Unsupported(format!(
                        "tiga and luigi need one-shot transactions whose keys are known from \
                         the arguments: the keys of piece {index} need the output of piece {} \
                         ({error}) and its procedure names no keys guarding them; choose \
                         another protocol",
                        piece.deps[0]
                    )));
                };
                let target = ShardTarget::Shard(piece.shard);
                let stray = guard.iter().find(|k| context.partitioner.target_of(k) != target);
                if guard.is_empty() || stray.is_some() {
                    return Err(ProcError::Contract(format!(
                        "the guard of piece {index} must be keys on its shard {}: {guard:?}",
                        piece.shard.0
                    )));
                }
                guarded = true;
                KeySet { reads: Vec::new(), writes: guard, scans: Vec::new() }
            }
            Err(error) => return Err(error),
        };
        if !keys.scans.is_empty() {
            return Err(ProcError::Unsupported(format!(
                "tiga and luigi order transactions by the keys they touch and do not run \
                 range scans (piece {index} scans); choose another protocol"
            )));
        }
        let part = parts.entry(piece.shard).or_insert_with(|| Part {
            pieces: Vec::new(),
            deps: Vec::new(),
            reads: Vec::new(),
            writes: Vec::new(),
            guarded: Vec::new(),
            inputs: Vec::new(),
            feeds: BTreeMap::new(),
        });
        if guarded {
            part.guarded.push(index as u32);
        }
        part.pieces.push(index as u32);
        part.deps.push(piece.deps.clone());
        for (into, keys) in [(&mut part.reads, keys.reads), (&mut part.writes, keys.writes)] {
            if into.is_empty() {
                *into = keys; // The common case, one piece per shard: no copy.
            } else {
                into.extend(keys);
            }
        }
    }
    if parts.is_empty() {
        return Err(ProcError::BadArgs("a transaction without pieces".into()));
    }
    // Bounded by the plan (at most PIECES_MAX pieces, each with its dependencies).
    for piece in &pieces {
        for &dep in &piece.deps {
            let source = pieces[dep as usize].shard; // check_one_shot checked the index.
            if source != piece.shard {
                parts.get_mut(&piece.shard).expect("bound").inputs.push((dep, source));
                let feeds = &mut parts.get_mut(&source).expect("bound").feeds;
                feeds.entry(piece.shard).or_default().push(dep);
            }
        }
    }
    for part in parts.values_mut() {
        for keys in [&mut part.reads, &mut part.writes] {
            keys.sort_unstable();
            keys.dedup();
        }
        part.inputs.sort_unstable();
        part.inputs.dedup();
        for fed in part.feeds.values_mut() {
            fed.sort_unstable();
            fed.dedup();
        }
    }
    Ok(Shape { parts, pieces_total: pieces.len() })
}

/// Checks that tiga can run `request` (bound with shard 0 as home): the error says why not.
pub fn check_request(context: &NodeContext, request: &TxnRequest) -> Result<(), ProcError> {
    shape_of(context, request, ShardId(0)).map(|_| ())
}

impl Part {
    pub(super) fn keys(&self) -> Vec<Key> {
        let mut keys = self.reads.clone();
        keys.extend(self.writes.iter().cloned());
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Its keys as a follower's log takes them ([`crate::tiga::replica::PartKeys`]).
    pub(super) fn log_keys(&self) -> crate::tiga::replica::PartKeys {
        (self.keys(), self.writes.clone())
    }

    /// True when the part declared `key` (read or written).
    pub(super) fn declares(&self, key: &Key) -> bool {
        self.reads.binary_search(key).is_ok() || self.writes.binary_search(key).is_ok()
    }
}

impl Shape {
    pub(super) fn shards(&self) -> Vec<ShardId> {
        self.parts.keys().copied().collect()
    }
}
