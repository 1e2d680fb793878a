//! The durable log store of one server process: an append-only file of checksummed batches of
//! key-value records (the Raft entries and hard states of every group the process hosts), and
//! the storage thread that group-commits the persist requests of all nodes with one `fsync`.
//!
//! File layout (`DIR/log`): a header `MERIDIAN-LOG v1\n`, then batches, each
//! `len:u32 LE ‖ crc32(payload):u32 LE ‖ payload`, the payload a postcard list of records.
//! Opening replays the batches into a map (later records win, `None` deletes):
//! - a batch cut short by the end of the file, or a last batch whose checksum fails, is a torn
//!   write: the file is truncated to the last whole batch and the open reports how many bytes
//!   it discarded;
//! - a batch whose checksum fails with more data after it is corruption in the middle: opening
//!   fails with the offset, rather than serving a log with a hole.
//!
//! After a successful open the file is rewritten as the live records (through a temporary
//! file, synced, renamed), so restarts read what is live, not the whole history. While the
//! process runs, the log keeps a copy of the live records (bounded by Raft snapshots: a
//! group's live records are its latest snapshot, the entries after it and its hard state) and
//! rewrites the file the same way once it has grown to [`REWRITE_RATIO`] times their size, so
//! the file stays within a constant factor of the live data.
//!
//! `DIR/identity` names the cluster and node the directory belongs to; a server pointed at
//! another cluster's or node's directory refuses to start.
//!
//! Why not fjall, the stack's default: the torn-tail and corruption rules (discard and report, refuse) need exact
//! control over what a partial or damaged write looks like on disk and what recovery does with
//! it, and a single appender with one sync per batch is all a Raft log needs here; this file is
//! about 200 lines with no background threads.

pub mod fjall_log;

use meridian_core::node::{Durability, PersistRecord};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};

const HEADER: &[u8] = b"MERIDIAN-LOG v1\n";
/// Largest batch written or read (a bigger length field is corruption). A snapshot is one
/// record, so this bounds a shard replica's snapshot too.
pub const BATCH_BYTES_MAX: usize = 1 << 30;
/// Batches of a rewrite hold about this many bytes each.
pub const REWRITE_BATCH_BYTES: usize = 64 << 20;
/// The file is rewritten once it is this many times the size of its live records...
pub const REWRITE_RATIO: u64 = 4;
/// ...and at least this big (a small log is not worth a rewrite).
pub const REWRITE_BYTES_MIN: u64 = 64 << 20;
const _: () = assert!(REWRITE_BATCH_BYTES < BATCH_BYTES_MAX);
/// Persist requests one group commit takes at most.
pub const GROUP_COMMIT_MAX: usize = 4_096;
/// Persist requests queued for the storage thread before nodes wait.
pub const STORAGE_QUEUE_MAX: usize = 1 << 16;

/// How durable persists are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityMode {
    /// Nothing is written; persists complete at once (benchmarks, simulation).
    Memory,
    /// Written to the file, never synced: survives a process crash, not a machine crash.
    Buffered,
    /// Written and `fsync`ed before a synced persist completes (one sync per group commit).
    Fsync,
}

impl DurabilityMode {
    /// Parses `--durability`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "memory" => Ok(Self::Memory),
            "buffered" => Ok(Self::Buffered),
            "fsync" => Ok(Self::Fsync),
            other => {
                Err(format!("unknown durability '{other}'; accepted: memory, buffered, fsync"))
            }
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Buffered => "buffered",
            Self::Fsync => "fsync",
        }
    }
}

/// Which store a process logs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogStoreKind {
    /// The log file of this module (the default).
    File,
    /// fjall ([`fjall_log`]).
    Fjall,
}

impl LogStoreKind {
    /// Parses `log_store` / `--log-store`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "file" => Ok(Self::File),
            "fjall" => Ok(Self::Fjall),
            other => Err(format!("unknown log store '{other}'; accepted: file, fjall")),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Fjall => "fjall",
        }
    }
}

/// An open durable log of either kind: what the storage thread writes to.
pub enum LogStore {
    /// The log file.
    File(LogFile),
    /// fjall.
    Fjall(fjall_log::FjallLog),
}

/// Refuses a directory that holds the other kind of store's data: opening it would start
/// from nothing and lose it.
fn check_kind(dir: &Path, kind: LogStoreKind) -> Result<(), String> {
    let (other, present) = match kind {
        LogStoreKind::File => ("fjall", dir.join(fjall_log::FOLDER).exists()),
        LogStoreKind::Fjall => ("file", dir.join("log").exists()),
    };
    if present {
        return Err(format!(
            "{} holds a {other} log store, not a {} one: refusing to start on it empty",
            dir.display(),
            kind.name()
        ));
    }
    Ok(())
}

impl LogStore {
    /// Opens (or creates) the store of `kind` in `dir`, which must belong to `identity`, and
    /// reads its live records.
    pub fn open(
        kind: LogStoreKind,
        dir: &Path,
        identity: &str,
    ) -> Result<(Self, Recovered), String> {
        check_kind(dir, kind)?;
        match kind {
            LogStoreKind::File => LogFile::open(dir, identity).map(|(l, r)| (Self::File(l), r)),
            LogStoreKind::Fjall => {
                fs::create_dir_all(dir)
                    .map_err(|e| io_error(dir, "cannot create the data directory", e))?;
                check_identity(dir, identity)?;
                let (log, recovered) = fjall_log::FjallLog::open(dir)?;
                Ok((Self::Fjall(log), recovered))
            }
        }
    }

    /// Reads the store of `kind` in `dir` for offline checks (fjall's own recovery may tidy
    /// its journal; the log file is not changed).
    pub fn read(kind: LogStoreKind, dir: &Path, identity: &str) -> Result<Recovered, String> {
        check_kind(dir, kind)?;
        match kind {
            LogStoreKind::File => LogFile::read(dir, identity),
            LogStoreKind::Fjall => {
                require_identity(dir, identity)?;
                fjall_log::FjallLog::open(dir).map(|(_, r)| r)
            }
        }
    }

    fn append(&mut self, records: &[PersistRecord]) -> Result<(), String> {
        match self {
            Self::File(log) => log.append(records),
            Self::Fjall(log) => log.append(records),
        }
    }

    fn sync(&mut self) -> Result<(), String> {
        match self {
            Self::File(log) => log.sync(),
            Self::Fjall(log) => log.sync(),
        }
    }

    /// A group commit that meets an injected disk failure: what a failing disk would have
    /// done to `records`, and the error the storage thread then stops on. `Ok` when the
    /// failure cannot strike this group commit (a failing sync, and nothing asks for one).
    fn append_failing(
        &mut self,
        records: &[PersistRecord],
        failure: DiskFailure,
        needs_sync: bool,
    ) -> Result<(), String> {
        match (failure, self) {
            (DiskFailure::Fsync, log) => {
                log.append(records)?;
                if needs_sync {
                    return Err("log sync failed: input/output error (injected)".into());
                }
                Ok(())
            }
            (DiskFailure::Full, _) => {
                Err("log write failed: no space left on device (injected)".into())
            }
            (DiskFailure::Torn, Self::File(log)) => {
                let mut out = Vec::new();
                encode_batch(records, &mut out);
                let half = out.len() / 2;
                log.file
                    .write_all(&out[..half])
                    .map_err(|e| io_error(&log.dir, "log write failed", e))?;
                Err(format!(
                    "log write torn (injected): {half} of {} bytes written, then the process stops",
                    out.len()
                ))
            }
            (DiskFailure::Torn, Self::Fjall(_)) => {
                Err("log write torn (injected; fjall writes a batch whole: nothing written)".into())
            }
        }
    }

    /// Rewrites the log file when it has grown (fjall compacts on its own).
    fn compact_if_grown(&mut self) -> Result<(), String> {
        match self {
            Self::File(log) => log.compact_if_grown().map(|_| ()),
            Self::Fjall(_) => Ok(()),
        }
    }
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// What opening a log found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The live records.
    pub records: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes of a torn tail that were discarded (0 when the file ended cleanly).
    pub torn_bytes_discarded: u64,
    /// Whole batches read.
    pub batches: u64,
}

/// The append-only log file of one process.
pub struct LogFile {
    dir: PathBuf,
    file: File,
    /// The live records, as a replay of the file would find them.
    live: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes of keys and values in `live`.
    live_bytes: u64,
    /// Bytes in the file.
    file_bytes: u64,
    /// Rewrites since the file was opened.
    rewrites: u64,
    /// The file is not rewritten below this size ([`REWRITE_BYTES_MIN`]; tests lower it).
    rewrite_bytes_min: u64,
    /// Encoding buffer kept between appends (up to [`SCRATCH_BYTES_KEPT`]).
    scratch: Vec<u8>,
}

/// The encoding buffer is kept between appends up to this capacity (a snapshot's batch is
/// not kept).
const SCRATCH_BYTES_KEPT: usize = 16 << 20;

fn record_bytes(key: &[u8], value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

/// Writes `records` as the whole log in `dir` (a temporary file, synced, then renamed over the
/// log, then the directory synced); returns the file's size.
fn write_image(dir: &Path, records: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<u64, String> {
    let tmp = dir.join("log.tmp");
    let path = dir.join("log");
    let write = || -> io::Result<u64> {
        let mut file = io::BufWriter::new(File::create(&tmp)?);
        file.write_all(HEADER)?;
        let mut written = HEADER.len() as u64;
        let mut batch: Vec<PersistRecord> = Vec::new();
        let mut batch_bytes = 0;
        let mut out = Vec::new();
        let mut records = records.iter().peekable();
        while let Some((key, value)) = records.next() {
            batch_bytes += key.len() + value.len();
            batch.push(PersistRecord { key: key.clone(), value: Some(value.clone()) });
            if batch_bytes >= REWRITE_BATCH_BYTES || records.peek().is_none() {
                out.clear();
                encode_batch(&batch, &mut out);
                file.write_all(&out)?;
                written += out.len() as u64;
                batch.clear();
                batch_bytes = 0;
            }
        }
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(written)
    };
    let written = write().map_err(|e| io_error(&tmp, "cannot write the log", e))?;
    fs::rename(&tmp, &path).map_err(|e| io_error(&path, "cannot replace the log", e))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(written)
}

fn io_error(path: &Path, what: &str, e: io::Error) -> String {
    format!("{}: {what}: {e}", path.display())
}

impl LogFile {
    /// Opens (or creates) the log in `dir`, which must belong to `identity`; replays it,
    /// discards a torn tail, refuses corruption in the middle, and compacts it.
    pub fn open(dir: &Path, identity: &str) -> Result<(Self, Recovered), String> {
        fs::create_dir_all(dir)
            .map_err(|e| io_error(dir, "cannot create the data directory", e))?;
        check_identity(dir, identity)?;
        let path = dir.join("log");
        let mut bytes = Vec::new();
        if path.exists() {
            File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(|e| io_error(&path, "cannot read the log", e))?;
        }
        let recovered = replay(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        drop(bytes);
        let file_bytes = write_image(dir, &recovered.records)?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io_error(&path, "cannot open the log", e))?;
        let live = recovered.records.clone();
        let live_bytes = live.iter().map(|(k, v)| record_bytes(k, v)).sum();
        let log = Self {
            dir: dir.to_path_buf(),
            file,
            live,
            live_bytes,
            file_bytes,
            rewrites: 0,
            rewrite_bytes_min: REWRITE_BYTES_MIN,
            scratch: Vec::new(),
        };
        Ok((log, recovered))
    }

    /// Rewrites the file as its live records if it has grown to [`REWRITE_RATIO`] times their
    /// size (and past [`REWRITE_BYTES_MIN`]). Call with everything appended durable: the
    /// rewrite replaces the file atomically. Returns whether it rewrote.
    pub fn compact_if_grown(&mut self) -> Result<bool, String> {
        if self.file_bytes < self.rewrite_bytes_min
            || self.file_bytes < REWRITE_RATIO * (self.live_bytes + HEADER.len() as u64)
        {
            return Ok(false);
        }
        self.file_bytes = write_image(&self.dir, &self.live)?;
        let path = self.dir.join("log");
        self.file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io_error(&path, "cannot reopen the log", e))?;
        self.rewrites += 1;
        Ok(true)
    }

    /// Lowers the size below which the file is never rewritten (tests).
    pub fn set_rewrite_bytes_min(&mut self, bytes: u64) {
        self.rewrite_bytes_min = bytes;
    }

    /// Bytes in the file now.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Bytes of the live records' keys and values.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Rewrites since the log was opened.
    pub fn rewrites(&self) -> u64 {
        self.rewrites
    }

    /// Reads the log in `dir` without changing anything (no rewrite, no identity written):
    /// for offline checks. The directory must belong to `identity`.
    pub fn read(dir: &Path, identity: &str) -> Result<Recovered, String> {
        require_identity(dir, identity)?;
        let log = dir.join("log");
        let bytes = fs::read(&log).map_err(|e| io_error(&log, "cannot read the log", e))?;
        replay(&bytes).map_err(|e| format!("{}: {e}", log.display()))
    }

    /// Appends one batch (buffered by the operating system).
    pub fn append(&mut self, records: &[PersistRecord]) -> Result<(), String> {
        // One buffer reused across appends: a fresh one per batch cost the storage thread
        // about a quarter of its time in page faults.
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        encode_batch(records, &mut out);
        let result = self.append_encoded(&out, records);
        if out.capacity() <= SCRATCH_BYTES_KEPT {
            self.scratch = out;
        }
        result
    }

    fn append_encoded(&mut self, out: &[u8], records: &[PersistRecord]) -> Result<(), String> {
        if out.len() - 8 > BATCH_BYTES_MAX {
            return Err(format!(
                "{}: a batch of {} bytes is over the log's limit of {BATCH_BYTES_MAX}",
                self.dir.display(),
                out.len() - 8
            ));
        }
        self.file.write_all(out).map_err(|e| io_error(&self.dir, "log write failed", e))?;
        self.file_bytes += out.len() as u64;
        for record in records {
            let old = match &record.value {
                Some(value) => {
                    self.live_bytes += record_bytes(&record.key, value);
                    self.live.insert(record.key.clone(), value.clone())
                }
                None => self.live.remove(&record.key),
            };
            if let Some(old) = old {
                self.live_bytes -= record_bytes(&record.key, &old);
            }
        }
        Ok(())
    }

    /// Makes everything appended durable.
    pub fn sync(&mut self) -> Result<(), String> {
        self.file.sync_data().map_err(|e| io_error(&self.dir, "log sync failed", e))
    }
}

/// Appends one batch (`len ‖ crc ‖ payload`) to `out`, encoding in place.
fn encode_batch(records: &[PersistRecord], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    *out = postcard::to_extend(records, std::mem::take(out)).expect("records encode");
    let len = (out.len() - start - 8) as u32;
    let crc = crc32(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Replays a log image. Public for tests and fuzzing.
pub fn replay(bytes: &[u8]) -> Result<Recovered, String> {
    let mut recovered = Recovered::default();
    if bytes.is_empty() {
        return Ok(recovered);
    }
    if bytes.len() < HEADER.len() {
        // A header cut short: the file was being created.
        if HEADER.starts_with(bytes) {
            recovered.torn_bytes_discarded = bytes.len() as u64;
            return Ok(recovered);
        }
        return Err("not a Meridian log (bad header)".into());
    }
    if &bytes[..HEADER.len()] != HEADER {
        return Err("not a Meridian log (bad header)".into());
    }
    let mut at = HEADER.len();
    while at < bytes.len() {
        let rest = &bytes[at..];
        let torn = |recovered: &mut Recovered| {
            recovered.torn_bytes_discarded = rest.len() as u64;
        };
        if rest.len() < 8 {
            torn(&mut recovered);
            break;
        }
        let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > BATCH_BYTES_MAX {
            if rest.len() < 8 + BATCH_BYTES_MAX {
                torn(&mut recovered);
                break;
            }
            return Err(format!("corrupt batch length {len} at offset {at}"));
        }
        if rest.len() < 8 + len {
            torn(&mut recovered);
            break;
        }
        let payload = &rest[8..8 + len];
        let intact = crc32(payload) == crc;
        let last = rest.len() == 8 + len;
        if !intact && last {
            torn(&mut recovered);
            break;
        }
        if !intact {
            return Err(format!(
                "corrupt batch at offset {at} (checksum mismatch) with {} bytes after it; refusing to start on a log with a hole",
                rest.len() - 8 - len
            ));
        }
        let records: Vec<PersistRecord> = postcard::from_bytes(payload).map_err(|e| {
            format!("batch at offset {at} passes its checksum but does not decode: {e}")
        })?;
        for record in records {
            match record.value {
                Some(value) => recovered.records.insert(record.key, value),
                None => recovered.records.remove(&record.key),
            };
        }
        recovered.batches += 1;
        at += 8 + len;
    }
    Ok(recovered)
}

/// Checks, without writing anything, that `dir` belongs to `identity` (offline reads).
fn require_identity(dir: &Path, identity: &str) -> Result<(), String> {
    let path = dir.join("identity");
    let found =
        fs::read_to_string(&path).map_err(|e| io_error(&path, "cannot read the identity", e))?;
    if found.trim_end() != identity {
        return Err(format!(
            "{} belongs to '{}', not '{identity}'",
            dir.display(),
            found.trim_end()
        ));
    }
    Ok(())
}

fn check_identity(dir: &Path, identity: &str) -> Result<(), String> {
    let path = dir.join("identity");
    match fs::read_to_string(&path) {
        Ok(found) if found.trim_end() == identity => Ok(()),
        Ok(found) => Err(format!(
            "{} belongs to '{}', not '{identity}': refusing to start on another cluster's or node's data",
            dir.display(),
            found.trim_end()
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let has_log = dir.join("log").exists();
            if has_log {
                return Err(format!(
                    "{} holds a log but no identity file: refusing to guess whose it is",
                    dir.display()
                ));
            }
            fs::write(&path, format!("{identity}\n"))
                .map_err(|e| io_error(&path, "cannot write the identity", e))
        }
        Err(e) => Err(io_error(&path, "cannot read the identity", e)),
    }
}

/// One persist request for the storage thread.
pub struct PersistJob {
    /// What to write.
    pub records: Vec<PersistRecord>,
    /// How durable before `done` runs.
    pub durability: Durability,
    /// Called (on the storage thread) once the records are as durable as asked.
    pub done: Box<dyn FnOnce() + Send>,
}

/// What the storage thread is asked to do.
enum StorageRequest {
    /// Write (and sync, as asked) some records.
    Persist(PersistJob),
    /// Finish what is queued before this, close the log and say so.
    Close(mpsc::SyncSender<()>),
}

/// A disk failure injected into a server's log (fault injection: `meridian nemesis`). The
/// next group commit it can strike fails as a failing disk would, and the storage thread stops
/// the process without completing any persist of that group commit: nothing whose write or
/// sync failed is ever acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFailure {
    /// The write lands, `fsync` reports an I/O error.
    Fsync,
    /// The write fails: no space left on the device.
    Full,
    /// Half of the batch reaches the file, then the process stops (a crash in mid-write; the
    /// next open discards the torn tail).
    Torn,
}

impl DiskFailure {
    /// Parses `fsync`, `full` or `torn`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "fsync" => Ok(Self::Fsync),
            "full" => Ok(Self::Full),
            "torn" => Ok(Self::Torn),
            other => Err(format!("unknown disk failure '{other}'; accepted: fsync, full, torn")),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fsync => "fsync",
            Self::Full => "full",
            Self::Torn => "torn",
        }
    }

    fn code(failure: Option<Self>) -> u8 {
        match failure {
            None => 0,
            Some(Self::Fsync) => 1,
            Some(Self::Full) => 2,
            Some(Self::Torn) => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Fsync),
            2 => Some(Self::Full),
            3 => Some(Self::Torn),
            _ => None,
        }
    }
}

/// The handle nodes send persist requests through.
#[derive(Clone)]
pub struct Storage {
    jobs: mpsc::SyncSender<StorageRequest>,
    /// Extra time every group commit takes before its completions run (a slow disk, for fault
    /// injection); 0 normally.
    delay_ns: Arc<AtomicU64>,
    /// An injected disk failure ([`DiskFailure::code`]); 0 normally.
    failure: Arc<AtomicU8>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Storage")
    }
}

impl Storage {
    /// Starts the storage thread over `log`. Errors writing the log stop the process: a node
    /// that cannot persist must not go on acknowledging.
    pub fn start(mut log: LogStore, mode: DurabilityMode) -> Self {
        let (jobs, queue) = mpsc::sync_channel::<StorageRequest>(STORAGE_QUEUE_MAX);
        let delay_ns = Arc::new(AtomicU64::new(0));
        let delay = delay_ns.clone();
        let failure = Arc::new(AtomicU8::new(0));
        let failing = failure.clone();
        std::thread::Builder::new()
            .name("meridian-storage".into())
            .spawn(move || {
                let mut closed = None;
                while let Ok(first) = queue.recv() {
                    let mut batch = Vec::new();
                    let mut next = Some(first);
                    while let Some(request) = next.take() {
                        match request {
                            StorageRequest::Persist(job) => batch.push(job),
                            StorageRequest::Close(ack) => {
                                closed = Some(ack);
                                break;
                            }
                        }
                        if batch.len() < GROUP_COMMIT_MAX {
                            next = queue.try_recv().ok();
                        }
                    }
                    let records: Vec<PersistRecord> =
                        batch.iter_mut().flat_map(|j| std::mem::take(&mut j.records)).collect();
                    let needs_sync = mode == DurabilityMode::Fsync
                        && batch.iter().any(|j| j.durability == Durability::Synced);
                    let result = match DiskFailure::from_code(failing.load(Ordering::Relaxed)) {
                        Some(failure) => log.append_failing(&records, failure, needs_sync),
                        None => log
                            .append(&records)
                            .and_then(|()| if needs_sync { log.sync() } else { Ok(()) })
                            .and_then(|()| log.compact_if_grown()),
                    };
                    if let Err(e) = result {
                        tracing::error!("{e}; stopping");
                        std::process::exit(3);
                    }
                    let slow_ns = delay.load(Ordering::Relaxed);
                    if slow_ns > 0 && !batch.is_empty() {
                        std::thread::sleep(std::time::Duration::from_nanos(slow_ns));
                    }
                    for job in batch {
                        (job.done)();
                    }
                    if closed.is_some() {
                        break;
                    }
                }
                // The log closes here, before the acknowledgement: whoever waits may reopen
                // its directory at once.
                drop(log);
                if let Some(ack) = closed {
                    let _ = ack.send(());
                }
            })
            .expect("the storage thread starts");
        Self { jobs, delay_ns, failure }
    }

    /// Queues a persist (waits while the queue is full).
    pub fn submit(&self, job: PersistJob) {
        // The thread ends only with the process or on `close`.
        let _ = self.jobs.send(StorageRequest::Persist(job));
    }

    /// Has every later group commit take `delay_ns` longer (0: as fast as the disk is).
    pub fn set_delay_ns(&self, delay_ns: u64) {
        self.delay_ns.store(delay_ns, Ordering::Relaxed);
    }

    /// Arms (or, with `None`, disarms) an injected disk failure for the next group commit it
    /// can strike.
    pub fn inject_failure(&self, failure: Option<DiskFailure>) {
        self.failure.store(DiskFailure::code(failure), Ordering::Relaxed);
    }

    /// Writes what was queued before this call, closes the log and stops the thread; returns
    /// once the log is closed (its directory can be opened again). Persists submitted later
    /// through another handle are dropped. Blocks: call it off the async runtime's threads.
    pub fn close(&self) {
        let (ack, done) = mpsc::sync_channel(1);
        if self.jobs.send(StorageRequest::Close(ack)).is_ok() {
            let _ = done.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u8, value: Option<u8>) -> PersistRecord {
        PersistRecord { key: vec![key], value: value.map(|v| vec![v; 3]) }
    }

    fn image(batches: &[Vec<PersistRecord>]) -> Vec<u8> {
        let mut out = HEADER.to_vec();
        for batch in batches {
            encode_batch(batch, &mut out);
        }
        out
    }

    #[test]
    fn replay_of_random_and_mutated_bytes_never_panics() {
        // The bounded version of the `log_file` fuzz target.
        let mut rng = meridian_core::rng::child_rng(7, "log-replay", 0);
        let good = image(&[vec![record(1, Some(1)), record(2, None)], vec![record(3, Some(3))]]);
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            let flips = 1 + meridian_core::rng::uniform_u64(&mut rng, 4);
            for _ in 0..flips {
                let at = meridian_core::rng::uniform_u64(&mut rng, bytes.len() as u64) as usize;
                bytes[at] = meridian_core::rng::uniform_u64(&mut rng, 256) as u8;
            }
            let cut = meridian_core::rng::uniform_u64(&mut rng, bytes.len() as u64 + 1) as usize;
            let _ = replay(&bytes[..cut]);
        }
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn replay_applies_batches_in_order() {
        let bytes = image(&[
            vec![record(1, Some(1)), record(2, Some(2))],
            vec![record(1, None), record(3, Some(3))],
        ]);
        let r = replay(&bytes).unwrap();
        assert_eq!(r.batches, 2);
        assert_eq!(r.torn_bytes_discarded, 0);
        assert_eq!(r.records.keys().cloned().collect::<Vec<_>>(), vec![vec![2], vec![3]]);
    }

    #[test]
    fn a_torn_tail_is_discarded_and_reported() {
        let whole = image(&[vec![record(1, Some(1))], vec![record(2, Some(2))]]);
        for cut in HEADER.len() + 1..whole.len() {
            let r = replay(&whole[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert!(r.torn_bytes_discarded > 0 || r.batches == 1, "cut at {cut}");
            assert!(r.records.contains_key(&vec![1]) || r.batches == 0, "cut at {cut}");
            assert!(!r.records.contains_key(&vec![2]), "cut at {cut}: a partial batch applied");
        }
        // The last batch fully written but with a flipped bit: torn, discarded.
        let mut flipped = whole.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        let r = replay(&flipped).unwrap();
        assert_eq!(r.batches, 1);
        assert!(r.torn_bytes_discarded > 0);
    }

    #[test]
    fn corruption_in_the_middle_refuses_to_open() {
        let mut bytes = image(&[vec![record(1, Some(1))], vec![record(2, Some(2))]]);
        bytes[HEADER.len() + 9] ^= 0x01; // inside the first batch's payload
        let error = replay(&bytes).err().unwrap();
        assert!(error.contains("corrupt batch at offset") && error.contains("refusing"), "{error}");
        assert!(replay(b"NOT A LOG AT ALL, REALLY").is_err());
    }

    #[test]
    fn a_growing_log_is_rewritten_to_its_live_records_and_reopens_the_same() {
        let dir = std::env::temp_dir().join(format!("meridian-logstore-rw-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (mut log, _) = LogFile::open(&dir, "cluster a node 2").unwrap();
        log.set_rewrite_bytes_min(16 << 10);
        let mut expected = BTreeMap::new();
        let mut rng = meridian_core::rng::child_rng(3, "log-rewrite", 0);
        for round in 0..3_000u32 {
            let key = vec![meridian_core::rng::uniform_u64(&mut rng, 20) as u8];
            let value = (meridian_core::rng::uniform_u64(&mut rng, 4) > 0)
                .then(|| round.to_le_bytes().repeat(25));
            match &value {
                Some(v) => expected.insert(key.clone(), v.clone()),
                None => expected.remove(&key),
            };
            log.append(&[PersistRecord { key, value }]).unwrap();
            log.sync().unwrap();
            log.compact_if_grown().unwrap();
            let on_disk = fs::metadata(dir.join("log")).unwrap().len();
            assert_eq!(on_disk, log.file_bytes());
            assert!(
                on_disk <= (16 << 10) + REWRITE_RATIO * (log.live_bytes() + 1_000),
                "round {round}: {on_disk} bytes on disk for {} live",
                log.live_bytes()
            );
        }
        assert!(log.rewrites() > 5, "{} rewrites", log.rewrites());
        drop(log);
        let (_, recovered) = LogFile::open(&dir, "cluster a node 2").unwrap();
        assert_eq!(recovered.records, expected);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_log_reopens_with_its_records_and_refuses_another_identity() {
        let dir = std::env::temp_dir().join(format!("meridian-logstore-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (mut log, recovered) = LogFile::open(&dir, "cluster a node 1").unwrap();
        assert!(recovered.records.is_empty());
        log.append(&[record(5, Some(5))]).unwrap();
        log.append(&[record(6, Some(6)), record(5, None)]).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, recovered) = LogFile::open(&dir, "cluster a node 1").unwrap();
        assert_eq!(recovered.records.keys().cloned().collect::<Vec<_>>(), vec![vec![6]]);
        // Append a torn half-batch by hand: discarded and reported on the next open.
        let mut raw = OpenOptions::new().append(true).open(dir.join("log")).unwrap();
        raw.write_all(&[200, 0, 0, 0, 1, 2]).unwrap();
        drop(raw);
        let (_, recovered) = LogFile::open(&dir, "cluster a node 1").unwrap();
        assert_eq!(recovered.torn_bytes_discarded, 6);
        assert_eq!(recovered.records.len(), 1);
        let error = LogFile::open(&dir, "cluster b node 1").err().unwrap();
        assert!(error.contains("refusing to start on another cluster"), "{error}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_injected_disk_failure_fails_the_group_commit_as_the_disk_would() {
        let dir =
            std::env::temp_dir().join(format!("meridian-logstore-fail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (mut log, _) = LogStore::open(LogStoreKind::File, &dir, "t").unwrap();
        log.append(&[record(1, Some(1))]).unwrap();
        log.sync().unwrap();
        // A full disk writes nothing; a failing sync writes, then fails; a buffered batch
        // gives a failing sync nothing to fail on.
        let full = log.append_failing(&[record(2, Some(2))], DiskFailure::Full, true);
        assert!(full.unwrap_err().contains("no space left"));
        log.append_failing(&[record(3, Some(3))], DiskFailure::Fsync, false).unwrap();
        let fsync = log.append_failing(&[record(4, Some(4))], DiskFailure::Fsync, true);
        assert!(fsync.unwrap_err().contains("sync failed"));
        let torn = log.append_failing(&[record(5, Some(5))], DiskFailure::Torn, true);
        assert!(torn.unwrap_err().contains("torn"));
        drop(log);
        // The torn half is discarded on the next open; the written records are back.
        let (_, recovered) = LogStore::open(LogStoreKind::File, &dir, "t").unwrap();
        assert!(recovered.torn_bytes_discarded > 0);
        let keys: Vec<Vec<u8>> = recovered.records.keys().cloned().collect();
        assert_eq!(keys, [vec![1], vec![3], vec![4]]);
        for kind in ["fsync", "full", "torn"] {
            assert_eq!(DiskFailure::parse(kind).unwrap().name(), kind);
        }
        assert!(DiskFailure::parse("melt").unwrap_err().contains("accepted"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_storage_thread_completes_jobs_in_order_after_writing_to_either_store() {
        for kind in [LogStoreKind::File, LogStoreKind::Fjall] {
            let dir = std::env::temp_dir().join(format!(
                "meridian-storage-{}-{}",
                kind.name(),
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            let (log, _) = LogStore::open(kind, &dir, "t").unwrap();
            let storage = Storage::start(log, DurabilityMode::Fsync);
            let (tx, rx) = mpsc::channel();
            for i in 0..100u8 {
                let tx = tx.clone();
                storage.submit(PersistJob {
                    records: vec![record(i, Some(i)), record(i.wrapping_sub(1), None)],
                    durability: if i % 2 == 0 { Durability::Synced } else { Durability::Buffered },
                    done: Box::new(move || tx.send(i).unwrap()),
                });
            }
            let order: Vec<u8> = (0..100).map(|_| rx.recv().unwrap()).collect();
            assert_eq!(order, (0..100).collect::<Vec<_>>());
            drop(storage);
            // Every job's records are there, deletes applied: only the last key is left. (The
            // storage thread may still hold fjall's lock for a moment after its last job.)
            let mut recovered = None;
            for _ in 0..200 {
                match LogStore::read(kind, &dir, "t") {
                    Ok(r) => {
                        recovered = Some(r);
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
            let recovered = recovered.expect("the store reopens");
            let keys: Vec<Vec<u8>> = recovered.records.keys().cloned().collect();
            assert_eq!(keys, vec![vec![99]], "{}", kind.name());
            // The other kind refuses this directory instead of starting empty on it.
            let other =
                if kind == LogStoreKind::File { LogStoreKind::Fjall } else { LogStoreKind::File };
            let error = LogStore::open(other, &dir, "t").err().unwrap();
            assert!(error.contains("refusing to start on it empty"), "{error}");
            let _ = fs::remove_dir_all(&dir);
        }
    }
}
