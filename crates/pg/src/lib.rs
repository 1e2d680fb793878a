//! PostgreSQL as a peer in the harness (`meridian bench --protocol postgres`): the same
//! workloads, closed-loop clients, statistics, invariant checks and reports as Meridian's
//! protocols, with each request run by a PostgreSQL server in one transaction at the chosen
//! isolation level (see [`sql`] for how keys and pieces map to SQL).
//!
//! The run: start a server of our own ([`server`]) or connect to `--pg-url`, create a fresh
//! schema, bulk-load the workload's initial data with binary `COPY`, run one connection per
//! client for warm-up plus duration, then read every table back into one store per shard and
//! run the workload's checks on them (TPC-C's consistency conditions included). Serialization
//! failures and deadlocks are retried with backoff and counted by cause, like any protocol's
//! conflicts; a `COMMIT` that got no answer is an unknown outcome.

pub mod server;
pub mod sql;

use meridian_bench::run::RunOutput;
use meridian_bench::stats::RunStats;
use meridian_core::rng::Rng;
use meridian_core::time::NS_PER_MS;
use meridian_core::txn::{
    AbortCounts, CommitPath, Registry, ShardTarget, TxnFailure, TxnOutcome, TxnRequest, TxnResult,
};
use meridian_core::{ConfigError, NodeId, RequestId, ShardId, Time};
use meridian_runtime::clock::WallClock;
use meridian_runtime::logstore::DurabilityMode;
use meridian_storage::MvccStore;
use meridian_workloads::clients::Completion;
use meridian_workloads::{InvariantCheck, Workload, WorkloadOptions};
use sql::{AttemptError, Finished, Isolation, Session, Statements};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, RwLock};
use tokio_postgres::{Client, Config, NoTls};

/// Attempts per request before it fails (as `occ`'s default).
const ATTEMPTS_MAX: u32 = 1_000;
/// Backoff between attempts: from 0.1 ms, doubling, at most 10 ms, with jitter.
const BACKOFF_NS_MIN: u64 = NS_PER_MS / 10;
const BACKOFF_NS_MAX: u64 = 10 * NS_PER_MS;
/// Table creations one request may wait for before it fails (each creates at least one).
const CREATES_PER_REQUEST_MAX: u32 = 256;
/// Completions queued between the clients and the statistics.
const COMPLETIONS_QUEUED_MAX: usize = 1 << 16;
/// Rows per binary `COPY` batch of the bulk load.
const LOAD_ROWS_PER_COPY: usize = 100_000;
/// Longest wait for the clients' last requests after the run.
const FINISH_WAIT: Duration = Duration::from_secs(30);
/// Connections beyond the clients': the harness's own, and some headroom.
const CONNECTIONS_EXTRA: u32 = 8;
/// Most clients (one connection each).
pub const CLIENTS_MAX: u32 = 2_000;
const _: () = assert!(BACKOFF_NS_MIN < BACKOFF_NS_MAX);

/// One run against PostgreSQL.
#[derive(Clone, Debug)]
pub struct PgExperiment {
    /// Workload name.
    pub workload: String,
    /// Workload options (the shard count only partitions the plans and the data).
    pub workload_options: WorkloadOptions,
    /// Closed-loop clients, one connection each.
    pub clients: u32,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds discarded at the start.
    pub warmup_s: f64,
    /// Master seed (the generators').
    pub seed: u64,
    /// Show a progress bar.
    pub progress: bool,
    /// The durability a started server gets (ignored with `url`).
    pub durability: DurabilityMode,
    /// The isolation level.
    pub isolation: Isolation,
    /// A running server to use instead of starting one.
    pub url: Option<String>,
}

/// Runs the experiment; errors before the clients start (no PostgreSQL, a server that does
/// not start or answer, a failed load) are configuration errors.
pub fn run(experiment: &PgExperiment) -> Result<RunOutput, ConfigError> {
    if experiment.clients == 0 || experiment.clients > CLIENTS_MAX {
        return Err(ConfigError::new(format!(
            "--clients must be in 1..={CLIENTS_MAX} with --protocol postgres (one connection each), got {}",
            experiment.clients
        )));
    }
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&experiment.workload, &experiment.workload_options)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ConfigError::new(format!("cannot start the tokio runtime: {e}")))?;
    runtime.block_on(async {
        let (server, config) = match &experiment.url {
            Some(url) => {
                let config: Config =
                    url.parse().map_err(|e| ConfigError::new(format!("--pg-url '{url}': {e}")))?;
                (None, config)
            }
            None => {
                let settings = server::Settings {
                    max_connections: experiment.clients + CONNECTIONS_EXTRA,
                    durability: experiment.durability,
                };
                let started =
                    tokio::task::spawn_blocking(move || server::TempServer::start(settings))
                        .await
                        .map_err(|e| {
                            ConfigError::new(format!("postgres: the start failed: {e}"))
                        })?;
                let server = started.map_err(ConfigError::new)?;
                let config = server.config();
                (Some(server), config)
            }
        };
        // Stops early when the process is interrupted (`meridian_bench::run::interrupted`),
        // always through here, so the schema is dropped and the server stopped and removed.
        let result = run_async(experiment, workload, config, server.is_some()).await;
        // The server outlives every connection of the run.
        drop(server);
        result
    })
}

async fn connect(config: &Config, schema: Option<&str>) -> Result<Client, String> {
    let mut config = config.clone();
    if let Some(schema) = schema {
        config.options(format!("-c search_path={schema}"));
    }
    config.connect_timeout(Duration::from_secs(10));
    let (client, connection) = config.connect(NoTls).await.map_err(|e| with_causes(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// An error with the chain of its causes ("error connecting to server: Connection refused").
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// What the clients share.
struct Shared {
    schema: String,
    registry: Registry,
    partitioner: meridian_core::txn::Partitioner,
    isolation: Isolation,
    /// Workload tables that exist.
    tables: RwLock<BTreeSet<u8>>,
    stop: AtomicBool,
    /// Per client: the request it is running (reported unknown if it never finishes).
    running: Vec<Mutex<Option<(RequestId, TxnRequest, Time)>>>,
    clock: WallClock,
}

async fn run_async(
    experiment: &PgExperiment,
    workload: Arc<dyn Workload>,
    config: Config,
    own_server: bool,
) -> Result<RunOutput, ConfigError> {
    let setup = |what: &str, e: String| ConfigError::new(format!("postgres: {what}: {e}"));
    let admin = connect(&config, None).await.map_err(|e| {
        let target = if own_server {
            "the started server"
        } else {
            "--pg-url (is the server running, and do the host, port, user and database match?)"
        };
        setup(&format!("cannot connect to {target}"), e)
    })?;
    let version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .map(|row| row.get(0))
        .map_err(|e| setup("SHOW server_version", e.to_string()))?;
    let mut settings = BTreeMap::new();
    for name in ["fsync", "synchronous_commit", "shared_buffers", "max_connections"] {
        if let Ok(row) = admin.query_one(&format!("SHOW {name}"), &[]).await {
            settings.insert(name.to_string(), row.get::<_, String>(0));
        }
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let schema = format!("meridian_{}_{stamp}", std::process::id());
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path = {schema}; CREATE SEQUENCE {}",
            sql::COMMIT_SEQUENCE
        ))
        .await
        .map_err(|e| setup("cannot create the schema", e.to_string()))?;
    let result =
        run_in_schema(experiment, workload, &config, &admin, &schema, version, settings).await;
    if !own_server {
        // A server of ours is removed whole; on someone else's, leave nothing behind.
        let _ = admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await;
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_in_schema(
    experiment: &PgExperiment,
    workload: Arc<dyn Workload>,
    config: &Config,
    admin: &Client,
    schema: &str,
    version: String,
    settings: BTreeMap<String, String>,
) -> Result<RunOutput, ConfigError> {
    let partitioner = workload.partitioner();
    let load_started = std::time::Instant::now();
    let tables = load(workload.as_ref(), &partitioner, admin)
        .await
        .map_err(|e| ConfigError::new(format!("postgres: bulk load failed: {e}")))?;
    let load_s = load_started.elapsed().as_secs_f64();
    if meridian_bench::run::interrupted() {
        return Err(ConfigError::new("interrupted; the run's server and data are removed"));
    }
    let shared = Arc::new(Shared {
        schema: schema.to_string(),
        registry: workload.registry(),
        partitioner: partitioner.clone(),
        isolation: experiment.isolation,
        tables: RwLock::new(tables),
        stop: AtomicBool::new(false),
        running: (0..experiment.clients).map(|_| Mutex::new(None)).collect(),
        clock: WallClock::new(),
    });
    let connections = open_connections(config, schema, experiment.clients).await?;
    let (sender, mut completions) = mpsc::channel::<Completion>(COMPLETIONS_QUEUED_MAX);
    let start = shared.clock.now_ns();
    let window_start = start + (experiment.warmup_s * 1e9) as u64;
    let window_end = window_start + (experiment.duration_s * 1e9) as u64;
    let tasks = spawn_clients(experiment, workload.as_ref(), connections, &shared, sender);
    let mut checker = workload.checker();
    let mut stats = RunStats::new(window_start, window_end);
    stats.name_types(&shared.registry);
    let bar = meridian_bench::run::progress_bar(
        experiment.warmup_s + experiment.duration_s,
        experiment.progress,
    );
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    while shared.clock.now_ns() < window_end && !meridian_bench::run::interrupted() {
        tokio::select! {
            Some(c) = completions.recv() => record_completion(&mut stats, checker.as_mut(), c),
            _ = ticker.tick() => {
                let elapsed_s = (shared.clock.now_ns() - start) as f64 / 1e9;
                bar.set_position((elapsed_s * 10.0) as u64);
                bar.set_message(format!("{} committed in window", stats.committed));
            }
        }
    }
    stop_clients(&shared, tasks, &mut completions, &mut stats, checker.as_mut()).await;
    bar.finish_and_clear();
    if meridian_bench::run::interrupted() {
        return Err(ConfigError::new("interrupted; the run's server and data are removed"));
    }
    let stores = read_back(admin, &shared).await.map_err(|e| {
        ConfigError::new(format!("postgres: cannot read the tables back for the checks: {e}"))
    })?;
    let views: Vec<(ShardId, &MvccStore)> = stores.iter().map(|(s, store)| (*s, store)).collect();
    let checks = checker.check(&views);
    let parameters = parameters(experiment, workload.as_ref(), version, settings);
    let summary = stats.summary();
    Ok(RunOutput {
        parameters,
        summary,
        first_failure: stats.first_failure.clone(),
        checks,
        checks_note: None,
        load: Some(meridian_bench::run::LoadReport { seconds: load_s, peak_rss_mib: None }),
        links: Vec::new(),
        node_panics: Vec::new(),
        messages_dropped: 0,
        protocol_counters: BTreeMap::new(),
        faults_applied: Vec::new(),
        messages_cut: 0,
        history_json: checker.history_json(),
    })
}

/// One connection per client, in the run's schema.
async fn open_connections(
    config: &Config,
    schema: &str,
    clients: u32,
) -> Result<Vec<Client>, ConfigError> {
    let mut connections = Vec::with_capacity(clients as usize);
    for _ in 0..clients {
        let client = connect(config, Some(schema)).await.map_err(|e| {
            ConfigError::new(format!("postgres: cannot open a client connection: {e}"))
        })?;
        connections.push(client);
    }
    Ok(connections)
}

/// Starts a client per connection, numbered in order, each with its own generator and seed;
/// they send their completions on `sender` (dropped here, so the queue closes once every
/// client has stopped).
fn spawn_clients(
    experiment: &PgExperiment,
    workload: &dyn Workload,
    connections: Vec<Client>,
    shared: &Arc<Shared>,
    sender: mpsc::Sender<Completion>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::with_capacity(connections.len());
    for (number, connection) in connections.into_iter().enumerate() {
        let generator = workload.generator(number as u32, experiment.seed);
        let seed = experiment.seed ^ (number as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        tasks.push(tokio::spawn(client_loop(
            number as u32,
            connection,
            generator,
            shared.clone(),
            sender.clone(),
            seed,
        )));
    }
    tasks
}

/// Counts one completion and shows it to the checker.
fn record_completion(stats: &mut RunStats, checker: &mut dyn InvariantCheck, c: Completion) {
    stats.add(&c, None);
    meridian_workloads::observe_completion(checker, &c);
}

/// Tells the clients to stop and waits for their last requests (at most [`FINISH_WAIT`]),
/// then cancels the rest: everything they completed is counted, and every request still
/// running is reported to the checker as unanswered.
async fn stop_clients(
    shared: &Shared,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    completions: &mut mpsc::Receiver<Completion>,
    stats: &mut RunStats,
    checker: &mut dyn InvariantCheck,
) {
    shared.stop.store(true, Ordering::SeqCst);
    let finish = tokio::time::sleep(FINISH_WAIT);
    tokio::pin!(finish);
    loop {
        tokio::select! {
            next = completions.recv() => match next {
                Some(c) => record_completion(stats, checker, c),
                None => break, // Every client has stopped.
            },
            _ = &mut finish => break,
        }
    }
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await; // Finished or cancelled: its slot and queue are final now.
    }
    while let Ok(c) = completions.try_recv() {
        record_completion(stats, checker, c);
    }
    for (number, slot) in shared.running.iter().enumerate() {
        if let Some((request, txn, at)) = slot.lock().expect("running lock").take() {
            checker.unanswered(number as u32, request, &txn, at);
        }
    }
}

/// The run's parameters as the report shows them.
fn parameters(
    experiment: &PgExperiment,
    workload: &dyn Workload,
    version: String,
    settings: BTreeMap<String, String>,
) -> serde_json::Value {
    serde_json::json!({
        "mode": "postgres",
        "protocol": "postgres",
        "protocol_options": { "isolation": experiment.isolation.name() },
        "workload": workload.describe(),
        "shards": experiment.workload_options.shards,
        "replicas": 1,
        "network": { "name": "lan", "regions": 1, "owd_ms_max": 0.0, "note": "a single PostgreSQL node over loopback; no delay emulated" },
        "durability": experiment.durability.name(),
        "server": {
            "version": version,
            "started_by_harness": experiment.url.is_none(),
            "settings": settings,
        },
        "load": "closed-loop, one request outstanding per client, no think time",
        "clients": experiment.clients,
        "duration_s": experiment.duration_s,
        "warmup_s": experiment.warmup_s,
        "seed": experiment.seed,
        "meridian_version": env!("CARGO_PKG_VERSION"),
        "provenance": meridian_bench::provenance::provenance(),
    })
}

/// One client: a request at a time until told to stop.
async fn client_loop(
    number: u32,
    client: Client,
    mut generator: Box<dyn meridian_workloads::TxnGenerator>,
    shared: Arc<Shared>,
    completions: mpsc::Sender<Completion>,
    seed: u64,
) {
    let mut statements = Statements::default();
    let mut rng = meridian_core::rng::child_rng(seed, "postgres-client", u64::from(number));
    let mut counter: u64 = 0;
    let slot = &shared.running[number as usize];
    while !shared.stop.load(Ordering::SeqCst) {
        let id = meridian_workloads::clients::request_id(number, counter);
        counter = (counter + 1) & meridian_workloads::clients::REQUEST_COUNTER_MASK;
        let txn = generator.next(id);
        let submitted_at = shared.clock.now_ns();
        *slot.lock().expect("running lock") = Some((id, txn.clone(), submitted_at));
        let outcome = run_request(&client, &mut statements, &shared, &txn, &mut rng).await;
        let completed_at = shared.clock.now_ns();
        generator.on_reply(id, &outcome);
        let lost = matches!(
            &outcome.result,
            TxnResult::Failed(TxnFailure::Rejected(_)) if client.is_closed()
        );
        *slot.lock().expect("running lock") = None;
        let completion = Completion {
            client: number,
            coordinator: NodeId(0),
            request: id,
            txn,
            submitted_at,
            completed_at,
            outcome,
            wan_hops: None,
        };
        if completions.send(completion).await.is_err() || lost {
            return; // The harness stopped listening, or the connection is gone.
        }
    }
}

/// Runs one request to its end: retries conflicts with backoff, creates missing tables.
async fn run_request(
    client: &Client,
    statements: &mut Statements,
    shared: &Shared,
    txn: &TxnRequest,
    rng: &mut Rng,
) -> TxnOutcome {
    let Some(procedure) = shared.registry.get(txn.proc).cloned() else {
        let why = format!("no procedure {}", txn.proc.0);
        return TxnOutcome::failed(TxnFailure::Procedure(meridian_core::txn::ProcError::BadArgs(
            why,
        )));
    };
    let mut aborts = AbortCounts::default();
    let mut retries = 0u32;
    let mut creates = 0u32;
    let shards = shards_of(procedure.as_ref(), txn, &shared.partitioner);
    loop {
        let tables = shared.tables.read().await.clone();
        let mut session = Session {
            client,
            statements,
            tables: &tables,
            partitioner: &shared.partitioner,
            isolation: shared.isolation,
        };
        let ending = match session.attempt(procedure.as_ref(), &txn.args).await {
            Ok(Finished::Committed { ts, outputs }) => TxnOutcome {
                result: TxnResult::Committed,
                outputs,
                commit_ts: Some(ts),
                retries,
                aborts,
                shards_touched: shards,
                path: CommitPath::OnePhase,
                speculative_ns: None,
            },
            Ok(Finished::UserAborted(why)) => TxnOutcome {
                result: TxnResult::UserAborted(why),
                ..TxnOutcome::failed(TxnFailure::RetriesExhausted)
            },
            Err(AttemptError::Conflict(cause)) => {
                aborts.add(cause);
                retries += 1;
                if retries >= ATTEMPTS_MAX {
                    TxnOutcome::failed(TxnFailure::RetriesExhausted)
                } else {
                    let pause = meridian_protocols::kit::coord::backoff_ns(
                        rng,
                        BACKOFF_NS_MIN,
                        BACKOFF_NS_MAX,
                        retries,
                    );
                    tokio::time::sleep(Duration::from_nanos(pause)).await;
                    continue;
                }
            }
            Err(AttemptError::MissingTables(missing)) => {
                creates += 1;
                if creates > CREATES_PER_REQUEST_MAX {
                    TxnOutcome::failed(TxnFailure::Rejected("tables keep going missing".into()))
                } else {
                    match create_tables(client, shared, &missing).await {
                        Ok(()) => continue,
                        Err(e) => TxnOutcome::failed(TxnFailure::Rejected(e)),
                    }
                }
            }
            Err(AttemptError::Procedure(error)) => TxnOutcome::failed(TxnFailure::Procedure(error)),
            Err(AttemptError::Failed(why)) => TxnOutcome::failed(TxnFailure::Rejected(why)),
            Err(AttemptError::Unknown(why)) => {
                TxnOutcome::failed(TxnFailure::Indeterminate(format!("no answer to COMMIT: {why}")))
            }
        };
        return TxnOutcome { retries, aborts, ..ending };
    }
}

/// The shards a request's plan names (for the cross-shard fraction); 1 when it cannot plan.
fn shards_of(
    procedure: &dyn meridian_core::txn::Procedure,
    txn: &TxnRequest,
    partitioner: &meridian_core::txn::Partitioner,
) -> u32 {
    let context = meridian_core::txn::PlanContext { partitioner };
    let Ok(plan) = procedure.plan(&txn.args, context) else { return 1 };
    let shards: BTreeSet<ShardId> = plan
        .iter()
        .filter_map(|p| match p.target {
            ShardTarget::Shard(s) => Some(s),
            ShardTarget::Any => None,
        })
        .collect();
    shards.len().max(1) as u32
}

/// Creates workload tables, one creator at a time (concurrent `CREATE TABLE IF NOT EXISTS`
/// of one name can fail on PostgreSQL's catalog).
async fn create_tables(
    client: &Client,
    shared: &Shared,
    missing: &BTreeSet<u8>,
) -> Result<(), String> {
    let mut tables = shared.tables.write().await;
    for &table in missing {
        if tables.contains(&table) {
            continue;
        }
        client
            .batch_execute(&sql::create_table_sql(table))
            .await
            .map_err(|e| format!("cannot create {}: {e}", sql::table_name(table)))?;
        tables.insert(table);
    }
    Ok(())
}

/// A row to load: key bytes and value.
type Row = (Vec<u8>, Vec<u8>);

/// Loads every shard's initial data, each key once (a replicated table's rows from shard 0),
/// and returns the tables created.
async fn load(
    workload: &dyn Workload,
    partitioner: &meridian_core::txn::Partitioner,
    admin: &Client,
) -> Result<BTreeSet<u8>, String> {
    let mut rows: BTreeMap<u8, Vec<Row>> = BTreeMap::new();
    for shard in 0..partitioner.shards() {
        let shard = ShardId(shard);
        let mut store = MvccStore::new();
        workload.load(shard, &mut store);
        for (key, version) in store.latest_values() {
            let owner = match partitioner.target_of(key) {
                ShardTarget::Shard(s) => s,
                ShardTarget::Any => ShardId(0),
            };
            let (Some(table), Some(value)) = (key.table_id(), &version.value) else { continue };
            if owner == shard {
                rows.entry(table).or_default().push((key.as_bytes().to_vec(), value.clone()));
            }
        }
    }
    let mut created = BTreeSet::new();
    for (table, rows) in rows {
        admin.batch_execute(&sql::create_table_sql(table)).await.map_err(|e| e.to_string())?;
        created.insert(table);
        for chunk in rows.chunks(LOAD_ROWS_PER_COPY) {
            copy_rows(admin, table, chunk).await?;
        }
    }
    admin.batch_execute("ANALYZE").await.map_err(|e| e.to_string())?;
    Ok(created)
}

async fn copy_rows(admin: &Client, table: u8, rows: &[Row]) -> Result<(), String> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;
    let sink = admin
        .copy_in(&format!("COPY {} (k, v) FROM STDIN BINARY", sql::table_name(table)))
        .await
        .map_err(|e| e.to_string())?;
    let writer = BinaryCopyInWriter::new(sink, &[Type::BYTEA, Type::BYTEA]);
    let mut writer = std::pin::pin!(writer);
    for (key, value) in rows {
        writer.as_mut().write(&[key, value]).await.map_err(|e| e.to_string())?;
    }
    writer.finish().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Reads every workload table back into one store per shard (a replicated table's rows into
/// every shard), for the workload's checks.
async fn read_back(admin: &Client, shared: &Shared) -> Result<Vec<(ShardId, MvccStore)>, String> {
    let shards = shared.partitioner.shards();
    let mut stores: Vec<(ShardId, MvccStore)> =
        (0..shards).map(|s| (ShardId(s), MvccStore::new())).collect();
    let tables = shared.tables.read().await.clone();
    for table in tables {
        let query =
            format!("SELECT k, v FROM {}.{} ORDER BY k", shared.schema, sql::table_name(table));
        for row in admin.query(&query, &[]).await.map_err(|e| e.to_string())? {
            let key = meridian_core::key::Key::from(row.get::<_, Vec<u8>>(0));
            let value: Vec<u8> = row.get(1);
            match shared.partitioner.target_of(&key) {
                ShardTarget::Shard(s) => {
                    if let Some((_, store)) = stores.get_mut(s.0 as usize) {
                        store.load(key, value);
                    }
                }
                ShardTarget::Any => {
                    for (_, store) in &mut stores {
                        store.load(key.clone(), value.clone());
                    }
                }
            }
        }
    }
    Ok(stores)
}
