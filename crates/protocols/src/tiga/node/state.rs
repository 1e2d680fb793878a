//! State images: a leader cuts its shard's state (finished log prefix, key hashes, store rows,
//! what it executed past the prefix) into parts for a rejoining follower, and the follower
//! checks and installs them. Checkpoints reuse the same image, so a restarted replica
//! installs its own checkpoint exactly as a transfer is installed.

use super::*;

/// Whether an image's head says its rows replace the store whole.
pub(super) fn head_whole(part: &StatePart) -> Option<bool> {
    match part {
        StatePart::Head { whole, .. } => Some(*whole),
        _ => None,
    }
}

/// `keys` (those written since the load, or every key) with their committed versions,
/// oldest first, in batches of about [`STATE_ROW_BYTES_MAX`] bytes: the store as a state
/// transfer or a checkpoint carries it. Lazy, and bounded by the keys given.
pub(super) fn store_rows<'a>(
    store: &'a MvccStore,
    mut keys: impl Iterator<Item = &'a Key> + 'a,
) -> impl Iterator<Item = Vec<(Key, Vec<StateVersion>)>> + 'a {
    std::iter::from_fn(move || {
        let mut rows = Vec::new();
        let mut bytes = 0;
        while bytes < STATE_ROW_BYTES_MAX {
            let Some(key) = keys.next() else { break };
            let chain: Vec<StateVersion> = store
                .versions(key)
                .iter()
                .filter(|v| v.state == VersionState::Committed)
                .map(|v| StateVersion { ts: v.ts, writer: v.writer, value: v.value.clone() })
                .collect();
            if chain.is_empty() {
                continue;
            }
            let values: usize = chain
                .iter()
                .map(|v| STATE_VERSION_BYTES + v.value.as_ref().map_or(0, Vec::len))
                .sum();
            bytes += key.len() + values;
            rows.push((key.clone(), chain));
        }
        (!rows.is_empty()).then_some(rows)
    })
}

/// A committed version of a state transfer or a checkpoint, for the store.
pub(super) fn committed_version(v: StateVersion) -> Version {
    Version { ts: v.ts, value: v.value, writer: v.writer, state: VersionState::Committed }
}

/// Leader: the state a rejoining follower takes ([`StatePart`]).
///
/// The store goes as it is, with the entries past the finished prefix that it already
/// reflects (applied: the follower skips them) and those executed but waiting for votes (their
/// writes: the follower applies them on a yes); the rest the follower executes from the log,
/// in log order. That reproduces the leader's state because conflicting entries sit in log
/// order and timestamp order alike: an entry applied past the prefix had no unfinished earlier
/// writer of its keys, so whatever still runs on those keys comes after it, or only reads
/// below it (and the leader keeps the versions a queued reader needs, see [`apply`]). `None`
/// while a body of an entry past the prefix is missing here (the hashes need its keys).
/// `floors`: the coordinators' decided floors known here; the transactions logged below the
/// base that they do not cover go along, so the follower still knows them as logged.
pub(super) fn state_image(
    host: &Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
    whole: bool,
) -> Option<Vec<StatePart>> {
    let upto = host.lead.finished;
    let mut hashes = host.replica.hashes().clone();
    let mut ahead: Vec<AheadEntry> = Vec::new();
    let mut position = upto;
    // Bounded by the log past the finished prefix, a window at a time.
    loop {
        let window = host.replica.log_since(position);
        if window.is_empty() {
            break;
        }
        for &(txn, ts) in window {
            hashes.toggle(txn, ts, &host.bodies.get(&txn)?.part.keys());
            if let Some(pending) = host.lead.pending.get(&txn) {
                let writes = pending.writes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                ahead.push((txn, Some(writes)));
            } else if !host.lead.queued.contains_key(&txn) {
                ahead.push((txn, None));
            }
        }
        position += window.len();
    }
    let end = position as u64;
    let base = host.replica.log_base();
    debug_assert!(base <= upto, "the log is dropped below the finished prefix only");
    let floor = host.replica.ts_high();
    let head = StatePart::Head { base: base as u64, upto: upto as u64, end, floor, whole };
    // Bounded by the transactions logged here (every one goes by; only the undecided stay).
    let lingering = host.replica.logged_below_base(|t| !is_decided(floors, t));
    let prefix = host.replica.log_prefix(upto);
    Some(image_parts(head, prefix, &lingering, floors, &hashes, &host.store, &ahead))
}

/// An image's parts, in the order [`install`] takes them: `head`, the prefix's entries, the
/// transactions below its base that still count as logged, the coordinators' decided
/// floors, the key hashes, the store's rows written since the load, and the entries ahead.
pub(super) fn image_parts(
    head: StatePart,
    prefix: &[(TxnId, Timestamp)],
    lingering: &[TxnId],
    floors: &BTreeMap<(NodeId, u64), u64>,
    hashes: &crate::tiga::quorum::KeyHashes,
    store: &MvccStore,
    ahead: &[AheadEntry],
) -> Vec<StatePart> {
    let max = crate::tiga::log::SYNC_ENTRIES_MAX;
    let mut parts = vec![head];
    parts.extend(prefix.chunks(max).map(|c| StatePart::Entries(c.to_vec())));
    parts.extend(lingering.chunks(max).map(|c| StatePart::Lingering(c.to_vec())));
    let floors: Vec<(NodeId, u64, u64)> = floors.iter().map(|(&(n, i), &f)| (n, i, f)).collect();
    parts.extend(floors.chunks(max).map(|c| StatePart::Decided(c.to_vec())));
    let pairs: Vec<(Key, u64)> = hashes.pairs().map(|(key, hash)| (key.clone(), hash)).collect();
    parts.extend(pairs.chunks(STATE_HASHES_MAX).map(|c| StatePart::Hashes(c.to_vec())));
    let whole = matches!(head_whole(&parts[0]), Some(true));
    let keys: Box<dyn Iterator<Item = &Key>> =
        if whole { Box::new(store.keys()) } else { Box::new(store.written_keys()) };
    parts.extend(store_rows(store, keys).map(StatePart::Rows));
    parts.extend(ahead.chunks(max).map(|c| StatePart::Ahead(c.to_vec())));
    parts
}

/// Rejoining follower: checks the transfer's `parts` and, if they hold together, makes them
/// this replica's state: the prefix as its synced log (executed), the leader's hashes, its
/// versions over the store as loaded, and the entries ahead. Nothing changes on an error.
/// Returns the coordinators' decided floors the leader sent, for the node to take up.
pub(super) fn install(
    context: &NodeContext,
    host: &mut Hosted,
    parts: Vec<StatePart>,
) -> Result<Vec<(NodeId, u64, u64)>, String> {
    // A deposed leader's store holds writes no log vouches for: only an image of every key
    // replaces it.
    let whole = parts.first().and_then(head_whole) == Some(true);
    if host.retired && !whole {
        return Err("a deposed leader's store is replaced by a whole image only".into());
    }
    let (floors, rows) = install_without_rows(context, host, parts)?;
    if whole {
        host.store = MvccStore::new();
        host.retired = false;
    }
    for (key, chain) in rows {
        let versions = chain.into_iter().map(committed_version).collect();
        host.store.restore_chain(key, versions);
    }
    Ok(floors)
}

/// What installing an image leaves to the caller: the coordinators' decided floors it
/// carried, and the store's rows to put over the store as loaded.
pub(super) type Installed = (Vec<(NodeId, u64, u64)>, Vec<(Key, Vec<StateVersion>)>);

/// [`install`], but the image's rows are returned, not put in the store (a restarted node's
/// store is loaded after the journal is read).
pub(super) fn install_without_rows(
    context: &NodeContext,
    host: &mut Hosted,
    parts: Vec<StatePart>,
) -> Result<Installed, String> {
    let mut parts = parts.into_iter();
    let Some(StatePart::Head { base, upto, end, floor, .. }) = parts.next() else {
        return Err("a state transfer starts with its head".into());
    };
    let (mut entries, mut pairs, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lingering, mut floors) = (Vec::new(), Vec::new());
    let mut ahead: Vec<AheadEntry> = Vec::new();
    let max = crate::tiga::log::SYNC_ENTRIES_MAX;
    for part in parts {
        match part {
            StatePart::Head { .. } => return Err("a second head".into()),
            StatePart::Entries(more) if more.len() <= max => entries.extend(more),
            StatePart::Lingering(more) if more.len() <= max => lingering.extend(more),
            StatePart::Decided(more) if more.len() <= max => floors.extend(more),
            StatePart::Hashes(more) if more.len() <= STATE_HASHES_MAX => pairs.extend(more),
            StatePart::Rows(more) => rows.extend(more),
            StatePart::Ahead(more) if more.len() <= max => ahead.extend(more),
            _ => return Err("an oversized part".into()),
        }
    }
    let listed = upto.checked_sub(base);
    if listed != Some(entries.len() as u64) || end < upto || ahead.len() as u64 > end - upto {
        return Err(format!(
            "{} entries for a prefix of {base}..{upto}, {} ahead of it in a log of {end}",
            entries.len(),
            ahead.len()
        ));
    }
    let base = usize::try_from(base).map_err(|_| "a base past this machine's positions")?;
    let in_order =
        |chain: &[StateVersion]| !chain.is_empty() && chain.windows(2).all(|w| w[0].ts < w[1].ts);
    if rows.iter().any(|(_, chain)| !in_order(chain)) {
        return Err("a key's versions out of timestamp order".into());
    }
    let hashes = crate::tiga::quorum::KeyHashes::from_pairs(pairs);
    let limits = replica_limits(context.topology.shards);
    let replica = Replica::rejoined(host.shard, limits, (base, entries, lingering), hashes, floor)
        .ok_or("the prefix lists a transaction twice")?;
    let ahead: BTreeMap<TxnId, Option<Overlay>> =
        ahead.into_iter().map(|(txn, writes)| (txn, writes.map(Overlay::from_iter))).collect();
    if ahead.keys().any(|&txn| replica.logged(txn)) {
        return Err("an entry both in the prefix and ahead of it".into());
    }
    let executed = replica.log_len();
    host.replica = replica;
    host.follow.executed = executed;
    host.commit = executed;
    host.follow.ahead = ahead;
    host.follow.rejoin_end = usize::try_from(end).unwrap_or(usize::MAX);
    host.bodies.clear();
    host.follow.outcomes.clear();
    host.follow.fed.clear();
    host.follow.closed.clear();
    host.follow.unlisted.clear();
    host.follow.tail_cut = Timestamp::ZERO;
    host.follow.joining = None;
    host.stashed = None;
    host.deposed = None;
    // What it reported at the view change that sent it here is not what it holds now.
    host.frozen = None;
    host.follower_checkpointed = executed;
    Ok((floors, rows))
}

impl TigaNode {
    /// Rejoining follower: asks the leader for its state transfer (from the next part it
    /// lacks), and asks again later if nothing comes.
    pub(super) fn ask_state(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get(&shard) else { return };
        let Some(joining) = &host.follow.joining else { return };
        let next = joining.parts.len() as u32;
        let msg = TigaMsg::Join {
            view: self.view.global,
            shard,
            start: follower_start(self.context.incarnation, host),
            transfer: joining.transfer,
            next,
            whole: host.retired,
            member_view: host.member_view,
        };
        out.send(host.leader, msg);
        if !joining.timer_set {
            // A window of parts may take a while on a slow link: ask again only after a
            // request's timeout.
            self.timers.set(Purpose::Join(shard), self.context.timing.rpc_timeout_ns, out);
            if let Some(joining) =
                self.hosted.get_mut(&shard).and_then(|h| h.follow.joining.as_mut())
            {
                joining.timer_set = true;
            }
        }
    }

    /// Leader: a follower asks for the shard's state. The first request of a start of the
    /// follower cuts an image, and every later one of that start is answered from it: the
    /// parts from `next` on (from the first when it names another transfer), a window at a
    /// time. Once the follower holds the image it acknowledges the prefix, and the log past
    /// it (bodies and outcomes) goes to it again.
    pub(super) fn on_join(
        &mut self,
        from: NodeId,
        (shard, start): (ShardId, Start),
        (transfer, next): (u64, u32),
        whole: bool,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() || !host.lead.followers.contains(&from) {
            self.counts.dropped_total += 1;
            return;
        }
        // Starts are ordered: a request of a start that has its state already, or of one
        // older than the latest heard, is a late copy.
        let joined = host.lead.joined.get(&from).copied();
        let latest = joined.max(host.lead.transfers.get(&from).map(|t| t.start));
        if joined == Some(start) || latest.is_some_and(|latest| start < latest) {
            return;
        }
        // One image per start of the follower, whatever its requests say: a request that
        // crossed the first parts on the way (transfer 0, or an older id) gets the same image
        // from its start, never a new one (a new cut per request restarted the transfer for
        // ever once requests came faster than the image's parts).
        let existing = host.lead.transfers.get(&from).filter(|t| t.start == start);
        let next = if let Some(existing) = existing {
            if existing.id == transfer {
                next
            } else {
                0
            }
        } else {
            // Not cut while a body past the finished prefix is missing here (the hashes need
            // its keys): the follower asks again.
            let Some(parts) = state_image(host, &self.decided_floors, whole) else { return };
            host.transfer_seq += 1;
            let id = host.transfer_seq;
            let upto = host.lead.finished;
            host.lead.transfers.insert(from, Transfer { id, start, parts });
            // A joining follower holds no log: it counts for nothing in the commit-point or
            // luigi's replication watermarks until it acknowledges the image. Its executed
            // count stays (a late copy of an old request cuts an image it never takes): that
            // count, at most the finished prefix, keeps the bodies past the prefix here.
            // Luigi: the bodies past the prefix go again with the log.
            if let Some(ack) = host.lead.acks.get_mut(&from) {
                ack.0 = 0;
            }
            let bodies_to = host.lead.bodies_to.get(&from).copied().unwrap_or(upto);
            host.lead.bodies_to.insert(from, bodies_to.min(upto));
            self.counts.transfers_total += 1;
            0
        };
        let transfer = &host.lead.transfers[&from];
        let total = transfer.parts.len() as u32;
        for index in next..next.saturating_add(STATE_WINDOW).min(total) {
            let msg = TigaMsg::State {
                view: self.view.global,
                shard,
                start,
                transfer: transfer.id,
                index,
                total,
                part: transfer.parts[index as usize].clone(),
            };
            out.send(from, msg);
        }
    }

    /// Rejoining follower: a part of the leader's state transfer. Parts are taken in order
    /// (others wait for a later request); once all are in, the state is checked and installed,
    /// or dropped whole if it does not hold together (a new transfer is asked for).
    pub(super) fn on_state(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        (transfer, index, total): (u64, u32, u32),
        part: StatePart,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(joining) = &mut host.follow.joining else { return };
        if from != host.leader || total == 0 || total > STATE_PARTS_MAX || index >= total {
            self.counts.dropped_total += 1;
            return;
        }
        if index == 0 && (joining.parts.is_empty() || transfer > joining.transfer) {
            // The first part picks the transfer; a newer one replaces it (the leader cut a new
            // image: a late acknowledgement from this node's previous start ended the first).
            joining.transfer = transfer;
            joining.total = total;
            joining.parts.clear();
        }
        if transfer != joining.transfer || total != joining.total {
            return;
        }
        if index as usize != joining.parts.len() {
            return; // Out of order or repeated: asked for again.
        }
        joining.parts.push(part);
        if joining.parts.len() < total as usize {
            if joining.parts.len() % STATE_WINDOW as usize == 0 {
                self.ask_state(shard, out);
            }
            return;
        }
        let parts = std::mem::take(&mut joining.parts);
        match install(&self.context, host, parts) {
            Ok(floors) => {
                self.counts.rejoined_total += 1;
                host.member_view = self.view.global;
                // The installed state is what this replica vouches for from now on.
                self.checkpoint_wanted = true;
                // Bounded by the part limits of the transfer.
                for (node, incarnation, floor) in floors {
                    raise_floor(&mut self.decided_floors, (node, incarnation), floor);
                }
                // The acknowledgement tells the leader where to resume the log.
                out.send(
                    host.leader,
                    ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                );
                if self.variant.every_replica() {
                    // Its log now matches the leader's through the image: a coordinator still
                    // waiting on an entry there may count it (after a view change, the new
                    // leader's followers hold no other log to vouch with). The latest
                    // entries only, those their coordinators have not decided.
                    let (view, end) = (self.view.global, host.replica.sync_point());
                    let from = end.saturating_sub(crate::tiga::log::SYNC_ENTRIES_MAX);
                    let floors = &self.decided_floors;
                    for (txn, ts) in host.replica.follower_entries(from, end) {
                        if !is_decided(floors, txn) {
                            let msg = slow_reply(view, host, txn, ts);
                            reply(host, txn, msg, out);
                        }
                    }
                }
                self.execute_all(now, out);
            }
            Err(_) => {
                // Dropped whole; the pending timer asks anew (not at once: a leader that keeps
                // sending a broken image must not set off a storm).
                self.counts.dropped_total += 1;
                host.follow.joining = Some(Joining { timer_set: true, ..Joining::default() });
            }
        }
    }
}
