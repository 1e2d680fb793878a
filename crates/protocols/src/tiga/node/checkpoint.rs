//! Checkpoints and restarts: what a leader's and a follower's journal checkpoint holds (an
//! image of the finished prefix plus the live records past it), and how a restarted replica
//! takes them up again.

use super::*;

/// What a replica of `shard` knows of a transaction whose body it finds in its journal;
/// an error when the body does not run here (a journal that is not this cluster's).
pub(super) fn journaled_known(
    context: &NodeContext,
    shard: ShardId,
    body: TxnBody,
) -> Result<Known, String> {
    let shape = shape_of(context, &body.request, body.home)
        .map_err(|e| format!("the tiga journal holds {} that does not run: {e}", body.txn))?;
    let part =
        shape.parts.get(&shard).cloned().ok_or_else(|| {
            format!("the tiga journal holds {} with nothing on {shard:?}", body.txn)
        })?;
    Ok(Known { body: Arc::new(body), owd_ns: None, part, shards: shape.shards() })
}

/// Leader: moves the finished prefix past every log entry executed and decided.
/// A restarted leader takes up the entries its checkpoint lists past its base: those queued
/// queue again, those waiting for votes wait again (holding their write keys), and finished
/// ones keep their bodies where the checkpoint had them.
pub(super) fn restore_checkpointed(
    host: &mut Hosted,
    entries: Vec<(TxnId, Timestamp, Option<Known>, crate::tiga::journal::EntryState)>,
) -> Result<(), String> {
    use crate::tiga::journal::EntryState;
    // Bounded by the checkpoint's entries.
    for (txn, ts, known, state) in entries {
        let at = (ts, txn);
        match (state, known) {
            (EntryState::Done, known) => {
                if let Some(known) = known {
                    host.bodies.insert(txn, known);
                }
            }
            (EntryState::Queued { hash }, Some(known)) => {
                host.lead.waits.enqueue(at, &known.part.reads, &known.part.writes);
                host.lead.queued.insert(txn, Queued { ts, hash, speculative: false });
                host.bodies.insert(txn, known);
            }
            (EntryState::Pending(p), Some(known)) => {
                let others: BTreeSet<ShardId> = p.others.iter().copied().collect();
                if others.len() != p.others.len()
                    || others.contains(&host.shard)
                    || p.votes.iter().any(|(s, _)| !others.contains(s))
                    || p.write_keys.iter().any(|k| !known.part.writes.contains(k))
                {
                    return Err(format!("the tiga checkpoint's {txn} does not hold together"));
                }
                host.lead.waits.enqueue(at, &known.part.reads, &p.write_keys);
                host.lead.waits.ran(at, &known.part.reads);
                let votes: BTreeMap<ShardId, bool> = p.votes.into_iter().collect();
                if p.others.iter().all(|s| votes.contains_key(s)) {
                    host.lead.complete.insert(txn);
                }
                let pending = Pending {
                    ts,
                    writes: p.writes.into_iter().collect(),
                    write_keys: p.write_keys,
                    own_ok: p.own_ok,
                    votes,
                    others: p.others,
                    feeds: p.feeds.into_iter().collect(),
                    inputs: p.inputs,
                };
                host.lead.pending.insert(txn, pending);
                host.bodies.insert(txn, known);
            }
            (_, None) => return Err(format!("the tiga checkpoint lacks {txn}'s body")),
        }
    }
    Ok(())
}

/// The transactions whose replies are kept, oldest first (each once, where it was last
/// pushed): the order in which a checkpoint lists them and the replies are evicted.
pub(super) fn answer_order(host: &Hosted) -> Vec<TxnId> {
    let mut seen = BTreeSet::new();
    let mut order: Vec<TxnId> = Vec::with_capacity(host.answers.len());
    // Bounded by the order's length.
    for &txn in host.answer_order.iter().rev() {
        if host.answers.contains_key(&txn) && seen.insert(txn) {
            order.push(txn);
        }
    }
    order.reverse();
    order
}

/// Leader: the log position a checkpoint is cut at: the finished prefix (for luigi, no
/// further than what is replicated, since its watermarks walk the log from there).
pub(super) fn checkpoint_base(host: &Hosted) -> usize {
    let base = match host.lead.streams {
        Some(_) => host.lead.finished.min(host.lead.replicated),
        None => host.lead.finished,
    };
    base.max(host.replica.log_base())
}

/// Leader: the records of a checkpoint of this shard ([`crate::tiga::journal::Checkpoint`]): its
/// log from [`checkpoint_base`] on with how far each entry got, the transactions logged below
/// it, the key hashes and release stamps, the store's rows written since the load, the
/// replies kept, the outcomes decided, and the live ordinary records (votes heard on
/// transactions not executed yet, open proposals, the promise, luigi's watermarks told).
/// Restarting from it gives the leader the state it had (what restarted from the whole
/// journal would have rebuilt), less the bodies of entries below the base.
pub(super) fn checkpoint_records(
    host: &Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
) -> Option<Vec<Record>> {
    use crate::tiga::journal::{
        Checkpoint as Part, DecidedRecord, EntryState, PendingRecord, LIST_MAX,
    };
    let shard = host.shard;
    let base = checkpoint_base(host);
    let log = host.replica.checkpoint_log(base)?;
    let stamp_floor = log.stamps.2;
    let mut records = vec![Record::Checkpoint(Part::Head {
        shard,
        base: base as u64,
        base_ts: log.base_ts,
        stamp_floor,
    })];
    let part = |p: Part| Record::Checkpoint(p);
    records.extend(
        log.below.chunks(LIST_MAX).map(|c| part(Part::InLog { shard, logged: c.to_vec() })),
    );
    let (reads, writes, _) = &log.stamps;
    for c in reads.chunks(LIST_MAX) {
        records.push(part(Part::Stamps { shard, reads: c.to_vec(), writes: Vec::new() }));
    }
    for c in writes.chunks(LIST_MAX) {
        records.push(part(Part::Stamps { shard, reads: Vec::new(), writes: c.to_vec() }));
    }
    records.extend(
        log.hashes.chunks(LIST_MAX).map(|c| part(Part::Hashes { shard, pairs: c.to_vec() })),
    );
    let rows = store_rows(&host.store, host.store.written_keys());
    records.extend(rows.map(|rows| part(Part::Rows { shard, rows })));
    // Bounded by the log past the base.
    for &(txn, ts) in &log.entries {
        let body = host.bodies.get(&txn).map(|k| (*k.body).clone());
        let state = if let Some(queued) = host.lead.queued.get(&txn) {
            EntryState::Queued { hash: queued.hash }
        } else if let Some(p) = host.lead.pending.get(&txn) {
            EntryState::Pending(Box::new(PendingRecord {
                writes: p.writes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                write_keys: p.write_keys.clone(),
                own_ok: p.own_ok,
                votes: p.votes.iter().map(|(&s, &ok)| (s, ok)).collect(),
                others: p.others.clone(),
                feeds: p.feeds.iter().map(|(&s, f)| (s, f.clone())).collect(),
                inputs: p.inputs.clone(),
            }))
        } else {
            EntryState::Done
        };
        debug_assert!(body.is_some() || state == EntryState::Done, "{txn} unfinished, no body");
        records.push(part(Part::Entry { shard, txn, ts, body, state }));
    }
    let answers: Vec<(TxnId, TigaMsg)> =
        answer_order(host).into_iter().map(|txn| (txn, host.answers[&txn].clone())).collect();
    records.extend(
        answers.chunks(LIST_MAX).map(|c| part(Part::Answers { shard, answers: c.to_vec() })),
    );
    let decided: Vec<(TxnId, DecidedRecord)> = host
        .lead
        .decided
        .iter()
        .map(|(&txn, d)| {
            let (ts, settled, own, all, inputs) = (d.ts, d.settled, d.own, d.all, d.inputs.clone());
            let feeds = d.feeds.iter().map(|(s, o)| (*s, o.clone())).collect();
            let others = d.others.clone();
            (txn, DecidedRecord { ts, settled, own, all, inputs, feeds, others })
        })
        .collect();
    records.extend(
        decided.chunks(LIST_MAX).map(|c| part(Part::Decided { shard, decided: c.to_vec() })),
    );
    let floors: Vec<(NodeId, u64, u64)> = floors.iter().map(|(&(n, i), &f)| (n, i, f)).collect();
    records
        .extend(floors.chunks(LIST_MAX).map(|c| part(Part::Floors { shard, floors: c.to_vec() })));
    // The live ordinary records.
    for (&txn, votes) in &host.lead.early_votes {
        for (&from, vote) in votes {
            let (ok, outputs) = (vote.ok, vote.outputs.clone());
            records.push(Record::Vote { shard, txn, from, ok, outputs });
        }
    }
    for (&txn, &ts) in &host.lead.journaled {
        match host.bodies.get(&txn) {
            Some(known) => {
                records.push(Record::Proposed { shard, ts, body: (*known.body).clone() })
            }
            None => debug_assert!(false, "{txn} proposed without its body"),
        }
    }
    if host.lead.promised > Timestamp::ZERO {
        records.push(Record::Promised { shard, ts: host.lead.promised });
    }
    if let Some(streams) = &host.lead.streams {
        for (worker, ts) in streams.told() {
            records.push(Record::Told { shard, worker, ts });
        }
    }
    Some(records)
}

pub(super) fn advance_finished(host: &mut Hosted) {
    if !host.replica.leads() {
        return;
    }
    // Each round takes a whole window or stops: bounded by the log.
    loop {
        let window = host.replica.log_since(host.lead.finished);
        let done = window
            .iter()
            .take_while(|(txn, _)| {
                !host.lead.queued.contains_key(txn) && !host.lead.pending.contains_key(txn)
            })
            .count();
        if done == 0 {
            break;
        }
        host.lead.finished += done;
        if done < window.len() {
            break;
        }
    }
}

/// Follower: the records of a checkpoint of this shard: the image of its executed prefix (a
/// state transfer's parts: the prefix, what lingers below its base, the coordinators' decided
/// floors, the key hashes over the prefix alone, the store's rows written since the load, and
/// the entries ahead of it that a transfer brought), then its synced entries past the prefix
/// with their bodies, the outcomes heard, and its tail. A restart installs the image as a
/// transfer is installed and runs the rest as the records they are. A rejoining follower's
/// checkpoint says so, and nothing else. `None` while a synced entry's body that its hashes
/// hold is missing (the next step checkpoints instead).
pub(super) fn follower_checkpoint_records(
    host: &Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
) -> Option<Vec<Record>> {
    let shard = host.shard;
    if host.follow.joining.is_some() {
        return Some(vec![Record::Joining { shard }]);
    }
    let max = crate::tiga::log::SYNC_ENTRIES_MAX;
    let executed = host.follow.executed;
    let base = host.replica.log_base();
    debug_assert!(base <= executed, "a follower drops only what it executed");
    let bodies = &host.bodies;
    let hashes =
        host.replica.hashes_below(executed, |txn| bodies.get(&txn).map(|k| k.part.keys()))?;
    let prefix = host.replica.follower_entries(base, executed);
    let floor = host.replica.ts_high();
    let end = host.follow.rejoin_end.max(executed) as u64;
    let head =
        StatePart::Head { base: base as u64, upto: executed as u64, end, floor, whole: false };
    let lingering = host.replica.follower_lingering();
    let ahead: Vec<AheadEntry> = host
        .follow
        .ahead
        .iter()
        .map(|(&txn, writes)| {
            let writes = writes.as_ref().map(|w| w.iter().map(|(k, v)| (k.clone(), v.clone())));
            (txn, writes.map(Iterator::collect))
        })
        .collect();
    let parts = image_parts(head, &prefix, &lingering, floors, &hashes, &host.store, &ahead);
    let mut records: Vec<Record> =
        parts.into_iter().map(|part| Record::Image { shard, part }).collect();
    // Bounded by the synced prefix past the executed one.
    let rest = host.replica.follower_entries(executed, usize::MAX);
    for (index, chunk) in rest.chunks(max).enumerate() {
        let entries = chunk
            .iter()
            .map(|&(txn, ts)| (txn, ts, bodies.get(&txn).map(|k| (*k.body).clone())))
            .collect();
        let at = (executed + index * max) as u64;
        records.push(Record::Synced { shard, at, entries });
    }
    // Bounded by the tail.
    let tail = host.replica.tail();
    for &(txn, ts) in &tail {
        let Some(known) = bodies.get(&txn) else {
            debug_assert!(false, "{txn} in the tail without its body");
            return None;
        };
        let hash = match host.answers.get(&txn) {
            Some(&TigaMsg::Fast { ts: said, hash, .. }) if said == ts => Some(hash),
            _ => None,
        };
        records.push(Record::Released { shard, ts, hash, body: (*known.body).clone() });
    }
    // Then (a restart keeps the outcomes of logged entries only) the outcomes of those
    // entries and of the tail's: a leader's sync may carry the outcome of an entry past the
    // entries it lists, which this replica released already. Others linger, of entries
    // executed already.
    for txn in rest.iter().chain(&tail).map(|&(txn, _)| txn) {
        if let Some((ok, inputs)) = host.follow.outcomes.get(&txn) {
            let outcome = SyncOutcome { txn, ok: *ok, inputs: inputs.clone() };
            records.push(Record::Outcome { shard, outcome });
        }
    }
    Some(records)
}

impl TigaNode {
    /// True when a checkpoint was asked for, or when a leader here finished
    /// [`crate::Timing::snapshot_interval_entries`] log entries since its last checkpoint (a
    /// follower executed as many, at its offset) and the journal grew since by a share of the
    /// last checkpoint's bytes ([`crate::Timing::snapshot_bytes_per_log_byte_max`], as for
    /// Raft's snapshots): a checkpoint encodes every row of the store, so with entries alone
    /// its cost per entry grew with the store. Never while a restarted leader runs its
    /// journal again.
    pub(super) fn checkpoint_due(&self) -> bool {
        let every = usize::try_from(self.context.timing.snapshot_interval_entries)
            .unwrap_or(usize::MAX)
            .max(1);
        let mut counted = false;
        for host in self.hosted.values() {
            if host.quiet || host.lead.recovering.is_some() {
                // Not while a new leader gathers reports: its journal holds the follower it
                // was until it leads (then a checkpoint is due at once).
                return false;
            }
            counted |= match host.replica.leads() {
                true => checkpoint_base(host) >= host.lead.checkpointed.saturating_add(every),
                false => {
                    // Past the next multiple of `every`, shifted by this follower's offset.
                    let offset = self.checkpoint_offset(host.shard, every);
                    let cycle = host.follower_checkpointed.saturating_add(offset) / every;
                    host.follow.executed.saturating_add(offset) / every > cycle
                }
            };
        }
        let per_byte = self.context.timing.snapshot_bytes_per_log_byte_max;
        let grown = self.journal.bytes_since_checkpoint().saturating_mul(per_byte);
        let paid = per_byte == 0 || grown >= self.counts.checkpoint_bytes_last;
        self.checkpoint_wanted || (counted && paid)
    }

    /// Where a follower of `shard` checkpoints in a cycle of `every` executed entries: its
    /// replica's distance from the leader's, in `replicas`ths of the cycle. A checkpoint holds
    /// back a node's sends until it is durable, and the followers of a shard execute at the
    /// same pace: checkpointing at the same entry, they stalled both commit paths of the shard
    /// at once (docs/notebook/); staggered, the leader and the other followers commit
    /// on.
    pub(super) fn checkpoint_offset(&self, shard: ShardId, every: usize) -> usize {
        let replicas = self.context.topology.replicas.max(1);
        let slot = self.context.topology.nodes[self.context.id.0 as usize]
            .replicas
            .iter()
            .find(|s| s.shard == shard)
            .map_or(0, |s| s.replica);
        let leader = self.view.leader_slot(shard, replicas);
        let distance = (slot + replicas - leader) % replicas;
        every / replicas as usize * distance as usize
    }

    /// Writes a checkpoint of every shard led here into the step's persist, and deletes the
    /// journal's records before it ([`crate::tiga::journal::Checkpoint`]).
    pub(super) fn write_checkpoint(&mut self) {
        // Every follower's part first: one whose hashes need a body still missing puts the
        // checkpoint off (it deletes every record before it, its shard's too).
        let mut followed = Vec::new();
        for host in self.hosted.values().filter(|h| !h.replica.leads()) {
            match follower_checkpoint_records(host, &self.decided_floors) {
                Some(records) => followed.push((host.shard, records)),
                None => {
                    // Every synced entry's body is here until it is executed or fetched.
                    debug_assert!(false, "{:?}: a synced entry lacks its body", host.shard);
                    self.counts.checkpoints_put_off_total += 1;
                    return;
                }
            }
        }
        self.checkpoint_wanted = false;
        let bytes_before = self.journal.bytes_total;
        let begin = self.journal.begin_checkpoint();
        let mut written = Vec::new();
        // The view, which a restart starts in (the records before the checkpoint go).
        let view = Record::View {
            global: self.view.global,
            local: self.view.local.clone(),
            detective: self.view.mode == Mode::Detective,
        };
        self.journal.write(&view);
        if cfg!(debug_assertions) {
            written.push(view);
        }
        for (shard, records) in followed {
            // Bounded by the shard's state: the records of one checkpoint.
            for record in &records {
                self.journal.write(record);
            }
            let host = self.hosted.get_mut(&shard).expect("hosted");
            host.follower_checkpointed = host.follow.executed;
            if cfg!(debug_assertions) {
                written.extend(records);
            }
        }
        for host in self.hosted.values_mut().filter(|h| h.replica.leads()) {
            let Some(records) = checkpoint_records(host, &self.decided_floors) else {
                debug_assert!(false, "a leader checkpoints its own log");
                continue;
            };
            // Bounded by the shard's state: the records of one checkpoint.
            for record in &records {
                self.journal.write(record);
            }
            host.lead.checkpointed = checkpoint_base(host);
            if cfg!(debug_assertions) {
                written.extend(records);
            }
        }
        self.journal.end_checkpoint(begin);
        self.counts.checkpoints_total += 1;
        self.counts.checkpoint_bytes_last = self.journal.bytes_total - bytes_before;
        if cfg!(debug_assertions) {
            self.debug_check_checkpoint(written);
        }
    }

    /// Debug builds: a leader restarted from the checkpoint `records` takes up exactly the
    /// state of every shard it leads that the checkpoint was cut from (the log, what was
    /// logged below it, hashes, release stamps, the entries queued and waiting for votes,
    /// replies kept, outcomes, votes heard, open proposals, the promise); only the bodies of
    /// finished entries it no longer needs may be missing.
    pub(super) fn debug_check_checkpoint(&self, records: Vec<Record>) {
        use crate::tiga::journal::Checkpoint as Part;
        let framed = std::iter::once(Record::Checkpoint(Part::Begin { seq: 0 }))
            .chain(records)
            .chain(std::iter::once(Record::Checkpoint(Part::End { seq: 0 })));
        let durable: BTreeMap<Vec<u8>, Vec<u8>> = framed
            .enumerate()
            .map(|(seq, record)| {
                let key = [crate::tiga::journal::KEY_PREFIX, &(seq as u64).to_be_bytes()].concat();
                (key, postcard::to_allocvec(&record).expect("records encode"))
            })
            .collect();
        let (shards, seqs) =
            crate::tiga::journal::recover(&durable).expect("a checkpoint recovers");
        let context = self.context.clone();
        let (variant, view) = (self.variant, self.view.clone());
        let mut again = Self::build(context, variant, view, self.owd, self.snapshot_reads)
            .expect("the node builds again");
        again.resume(shards, seqs).expect("a checkpoint resumes");
        assert_eq!(again.decided_floors, self.decided_floors, "the coordinators' floors");
        for (&shard, host) in self.hosted.iter().filter(|(_, h)| !h.replica.leads()) {
            again.restore_follower(shard);
            let restored = &again.hosted[&shard];
            let summary = |h: &Hosted| {
                let log = h.replica.follower_entries(h.follow.executed, usize::MAX);
                let hashes: Vec<_> = h.replica.hashes().pairs().collect();
                let tail = h.replica.tail();
                let outcomes: Vec<_> = log
                    .iter()
                    .chain(&tail)
                    .filter_map(|(txn, _)| h.follow.outcomes.get(txn))
                    .collect();
                format!(
                    "{:?} {:?} {} {} {log:?} {:?} {hashes:?} {:?} {:?}",
                    h.follow.joining.is_some(),
                    h.follow.executed,
                    h.replica.sync_point(),
                    h.replica.log_len(),
                    h.replica.tail(),
                    outcomes,
                    h.follow.ahead,
                )
            };
            assert_eq!(summary(host), summary(restored), "{shard:?}: the follower's log");
        }
        for (shard, host) in self.hosted.iter().filter(|(_, h)| h.replica.leads()) {
            let restored = &again.hosted[shard];
            let base = host.lead.checkpointed;
            let log = |h: &Hosted| {
                let mut log = h.replica.checkpoint_log(base).expect("a leader's log");
                log.below.sort_unstable();
                format!("{log:?}")
            };
            assert_eq!(log(host), log(restored), "{shard:?}: the log");
            let summary = |h: &Hosted| {
                let queued: Vec<_> = h
                    .lead
                    .queued
                    .iter()
                    .filter(|(_, q)| !q.speculative)
                    .map(|(t, q)| (*t, q.ts, q.hash))
                    .collect();
                format!(
                    "{queued:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                    h.lead.pending,
                    h.lead.complete,
                    h.answers,
                    answer_order(h),
                    (&h.lead.decided, &h.lead.settling),
                    h.lead.early_votes,
                    h.lead.journaled,
                    h.lead.promised,
                )
            };
            assert_eq!(summary(host), summary(restored), "{shard:?}: the entries and records");
            assert_eq!(restored.lead.finished, base, "{shard:?}: finished up to the base");
        }
    }

    /// A restarted node takes up what its journal holds (before the stores are loaded; the
    /// log runs again when the node starts): per shard it leads, the log with its bodies,
    /// hashes and release stamps, the votes heard, the promised closed timestamp, and the
    /// proposals still open, held again where they were proposed. Errors when the journal
    /// speaks of a shard this node does not lead or of a transaction it cannot read.
    /// One piece: the journal's records of a shard are taken in the order they were
    /// written, each building on the state the previous ones left.
    pub(super) fn resume(
        &mut self,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
    ) -> Result<(), String> {
        self.journal = Journal::new(seqs);
        let limits = replica_limits(self.context.topology.shards);
        let detective = self.view.mode == Mode::Detective;
        for (shard, mut recovered) in shards {
            if let Some(followed) = recovered.follower.take() {
                if self.hosted.get(&shard).is_some_and(|h| h.replica.leads()) {
                    if followed.joining {
                        // Chosen to lead while it rejoined (or as a deposed leader waiting to
                        // lead on from the state it kept, which a restart loses): it holds no
                        // log, rejoins, and says it cannot lead.
                        self.demote_to_rejoin(shard);
                    } else if self.view_journaled {
                        // Promoted at a view change and restarted before its first checkpoint
                        // as the leader: the follower it was gathers the reports again.
                        self.demote_to_gather(shard);
                    }
                }
                self.resume_follower(shard, followed)?;
                continue;
            }
            let Some(host) = self.hosted.get_mut(&shard).filter(|h| h.replica.leads()) else {
                return Err(format!("the tiga journal speaks of {shard:?}, not led here"));
            };
            let context = &self.context;
            let known =
                |ts: Timestamp, body: TxnBody| -> Result<(TxnId, Timestamp, Known), String> {
                    let txn = body.txn;
                    Ok((txn, ts, journaled_known(context, shard, body)?))
                };
            // The checkpoint's state, if the journal has one.
            let mut start = None;
            let mut checkpointed = Vec::new();
            let mut rest = None;
            if let Some(c) = recovered.checkpoint {
                let base = usize::try_from(c.base)
                    .map_err(|_| "the tiga checkpoint's base is past this machine's positions")?;
                for (txn, ts, body, state) in c.entries {
                    let known = body.map(|b| known(ts, b)).transpose()?.map(|(_, _, k)| k);
                    checkpointed.push((txn, ts, known, state));
                }
                // Those below the base are forgotten once decided and promised past, as
                // before the restart.
                let forgettable_max = self.context.limits.forgettable_max;
                let below = c.in_log.iter().map(|&(txn, ts)| (ts, txn)).take(forgettable_max);
                host.lead.forgettable = below.collect();
                host.lead.forgettable_overflowed = c.in_log.len() > forgettable_max;
                start = Some(CheckpointedLog {
                    base,
                    base_ts: c.base_ts,
                    below: c.in_log,
                    entries: checkpointed.iter().map(|&(txn, ts, ..)| (txn, ts)).collect(),
                    hashes: c.hashes,
                    stamps: (c.reads, c.writes, c.stamp_floor),
                });
                for &(node, incarnation, below) in &c.floors {
                    raise_floor(&mut self.decided_floors, (node, incarnation), below);
                }
                rest = Some((base, c.rows, c.answers, c.decided));
            }
            let log: Vec<(TxnId, Timestamp, Known)> = recovered
                .log
                .into_iter()
                .map(|(ts, body)| known(ts, body))
                .collect::<Result<_, _>>()?;
            let entries: Vec<(TxnId, Timestamp, &[Key], &[Key])> = log
                .iter()
                .map(|(txn, ts, k)| (*txn, *ts, &k.part.reads[..], &k.part.writes[..]))
                .collect();
            let (replica, hashes) = Replica::recovered_leader(shard, limits, start, &entries)
                .ok_or_else(|| {
                    format!("the tiga journal lists a transaction twice on {shard:?}")
                })?;
            host.replica = replica.with_detective(detective);
            if let Some((base, rows, answers, decided)) = rest {
                self.counts.resumed_from_checkpoint_total += 1;
                restore_checkpointed(host, checkpointed)?;
                host.lead.finished = base;
                host.lead.pruned = base;
                host.lead.checkpointed = base;
                host.lead.replicated = base;
                host.restore_rows = rows;
                for (txn, msg) in answers {
                    if host.answers.insert(txn, msg).is_none() {
                        host.answer_order.push_back(txn);
                    }
                }
                for (txn, d) in decided {
                    if d.settled {
                        host.lead.settling.insert((d.ts, txn));
                    }
                    let others: BTreeSet<ShardId> = d.others.iter().copied().collect();
                    let shards_total = self.context.topology.shards;
                    if others.len() != d.others.len()
                        || others.contains(&host.shard)
                        || others.iter().any(|s| s.0 >= shards_total)
                    {
                        return Err(format!("the tiga checkpoint's {txn} names bad shards"));
                    }
                    let (ts, settled, own, all, inputs) = (d.ts, d.settled, d.own, d.all, d.inputs);
                    let feeds = d.feeds.into_iter().take(PIECES_MAX).collect();
                    let others = d.others;
                    let decided = Decided { ts, settled, own, all, inputs, feeds, others };
                    host.lead.decided.insert(txn, decided);
                }
            }
            self.counts.replayed_total += log.len() as u64;
            for ((txn, ts, known), hash) in log.into_iter().zip(hashes) {
                host.lead.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                host.lead.queued.insert(txn, Queued { ts, hash, speculative: false });
                host.bodies.insert(txn, known);
            }
            for (txn, votes) in recovered.votes {
                for (from, (ok, outputs)) in votes {
                    deliver_vote(host, txn, from, PeerVote { ok, outputs });
                }
            }
            host.lead.promised = recovered.promised;
            host.lead.closed_sent = recovered.promised;
            if let Some(streams) = &mut host.lead.streams {
                // Luigi: nothing is told below what was told, and every entry above it
                // counts as unreplicated until the followers' acknowledgements come.
                for (&worker, &ts) in &recovered.told {
                    streams.restore_told(worker, ts);
                }
                for &(txn, ts) in host.replica.log_prefix(usize::MAX) {
                    streams.restore_open(txn, ts);
                }
            }
            for (txn, (ts, body)) in recovered.proposals {
                let (_, _, known) = known(ts, body)?;
                let arriving = incoming(txn, ts, &known.shards, &known.part);
                host.bodies.insert(txn, known);
                host.lead.journaled.insert(txn, ts);
                let actions = host.replica.restore_proposal(arriving, ts);
                if let Some(streams) = &mut host.lead.streams {
                    streams.restore_held(txn, ts);
                }
                self.counts.restored_proposals_total += 1;
                self.restored.push((shard, actions));
            }
            host.quiet = true;
        }
        Ok(())
    }

    /// A restarted follower takes up what its journal holds of `shard`: the image of its
    /// executed prefix, installed as a state transfer is (its rows wait for the store's
    /// load), and the records after it, read back here and run when the node starts. One
    /// that was rejoining rejoins. Errors when the shard is led here, or when the image or a
    /// body does not hold together.
    pub(super) fn resume_follower(
        &mut self,
        shard: ShardId,
        followed: FollowerRecovered,
    ) -> Result<(), String> {
        let context = &self.context;
        let Some(host) = self.hosted.get_mut(&shard).filter(|h| !h.replica.leads()) else {
            return Err(format!("the tiga journal follows {shard:?}, not followed here"));
        };
        if followed.joining {
            // It rejoins, as a follower restarted without a journal does.
            host.follow.joining = Some(Joining::default());
            return Ok(());
        }
        host.follow.joining = None;
        if !followed.image.is_empty() {
            let (floors, rows) = install_without_rows(context, host, followed.image)
                .map_err(|e| format!("the tiga journal's image of {shard:?}: {e}"))?;
            for (node, incarnation, floor) in floors {
                raise_floor(&mut self.decided_floors, (node, incarnation), floor);
            }
            host.restore_rows = rows;
        }
        let known = |body: TxnBody| journaled_known(context, shard, body);
        let mut events = Vec::with_capacity(followed.events.len());
        // Bounded by the journal.
        for event in followed.events {
            events.push(match event {
                FollowerEvent::Released(ts, hash, body) => {
                    Restored::Released(ts, hash, known(body)?)
                }
                FollowerEvent::Synced(at, entries) => {
                    let at = usize::try_from(at).map_err(|_| "a position past this machine's")?;
                    let entries = entries
                        .into_iter()
                        .map(|(txn, ts, body)| Ok((txn, ts, body.map(known).transpose()?)))
                        .collect::<Result<_, String>>()?;
                    Restored::Synced(at, entries)
                }
                FollowerEvent::Fetched(body) => Restored::Fetched(known(body)?),
                FollowerEvent::Outcome(outcome) => Restored::Outcome(outcome),
                FollowerEvent::Unlisted(through) => Restored::Unlisted(through),
            });
        }
        host.restore_events = events;
        host.quiet = true;
        self.counts.followers_resumed_total += 1;
        Ok(())
    }

    /// A restarted follower runs what it journaled after its image (quietly: the replies
    /// are kept to answer resends), as it did the first time.
    pub(super) fn restore_follower(&mut self, shard: ShardId) {
        let (view, every_replica) = (self.view.global, self.variant.every_replica());
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let mut scratch = Outbox::new();
        // Bounded by the journal.
        for event in std::mem::take(&mut host.restore_events) {
            let mut slow = Vec::new();
            match event {
                Restored::Released(ts, hash, known) => {
                    let txn = known.body.txn;
                    let keys = known.part.log_keys();
                    host.bodies.insert(txn, known);
                    if host.replica.restore_released(txn, ts, keys) {
                        if let Some(hash) = hash {
                            let msg = TigaMsg::Fast {
                                view,
                                txn,
                                shard,
                                ts,
                                hash,
                                owd_ns: None,
                                result: None,
                            };
                            reply(host, txn, msg, &mut scratch);
                        }
                    }
                }
                Restored::Synced(at, entries) => {
                    let mut listed = Vec::with_capacity(entries.len());
                    for (txn, ts, known) in entries {
                        if let Some(known) = known {
                            host.bodies.entry(txn).or_insert(known);
                        }
                        listed.push((txn, ts));
                    }
                    let bodies = &host.bodies;
                    let keys_of = |txn| bodies.get(&txn).map(|k: &Known| k.part.log_keys());
                    slow = host.replica.on_sync(at, &listed, keys_of);
                }
                Restored::Fetched(known) => {
                    let txn = known.body.txn;
                    if host.replica.wants_body(txn) {
                        let keys = known.part.log_keys();
                        host.bodies.insert(txn, known);
                        slow = host.replica.on_body(txn, &keys);
                    }
                }
                Restored::Outcome(SyncOutcome { txn, ok, inputs }) => {
                    if host.replica.logged(txn) {
                        host.follow.outcomes.insert(txn, (ok, inputs));
                    }
                }
                Restored::Unlisted(through) => {
                    host.follow.tail_cut = host.follow.tail_cut.max(through);
                    let dropped = host.replica.drop_unlisted(through);
                    host.follow.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                }
            }
            for action in slow {
                match (action, every_replica) {
                    // Luigi followers answer their leader only (acknowledgements).
                    (Action::SlowReply { txn, ts }, true) => {
                        let msg = slow_reply(view, host, txn, ts);
                        reply(host, txn, msg, &mut scratch);
                    }
                    (Action::Superseded { dropped }, _) => {
                        host.follow.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                    }
                    _ => {}
                }
            }
        }
        debug_assert!(scratch.drain().next().is_none(), "a quiet replica sends nothing");
    }

    /// A restarted leader runs its journaled log again (replies recorded to answer resends,
    /// not sent; votes sent, as peers may wait for them), and proposes again what it had
    /// proposed. A restarted follower runs its journal's records again.
    pub(super) fn replay(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        // A checkpoint's rows go over the initial load, before anything runs.
        for host in self.hosted.values_mut() {
            for (key, chain) in std::mem::take(&mut host.restore_rows) {
                let versions = chain.into_iter().map(committed_version).collect();
                host.store.restore_chain(key, versions);
            }
        }
        for shard in self.hosted_shards.clone() {
            if self.hosted.get(&shard).is_some_and(|h| !h.replica.leads() && h.quiet) {
                self.restore_follower(shard);
            }
        }
        for (shard, actions) in std::mem::take(&mut self.restored) {
            self.act(now, shard, actions, None, out);
        }
        self.execute_all(now, out);
        for host in self.hosted.values_mut().filter(|h| h.quiet) {
            host.quiet = false;
        }
        self.release(now, out);
    }
}
