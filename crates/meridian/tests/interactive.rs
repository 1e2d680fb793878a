//! Interactive transactions end to end: `meridian server` processes running `bank`, driven
//! through the client library (`meridian-client`) and `meridian kv`, under each protocol that
//! serves them (`occ`, `2pl` no-wait and wound-wait, `2pc-mvto`).
//!
//! The invariant: many concurrent interactive transfers (read two balances, write both) keep
//! the total, whatever aborted; an audit transaction reads every account at the end. Also: an
//! operation after the end is refused, a client that vanishes without committing leaves no
//! lock behind once the lease has passed, and `meridian kv` refuses a bad statement before
//! running anything.

#[allow(dead_code)] // Each test binary uses part of the helpers.
mod common;

use common::{free_port, meridian, wait_for_port};
use meridian_client::{Client, Error, Key, Options, Retry};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const ACCOUNTS_PER_SHARD: u64 = 4;
const SHARDS: u64 = 2;
const INITIAL_CENTS: i64 = 10_000;

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A bank cluster of two one-replica shards and two client nodes; returns its file.
fn cluster(dir: &Path, protocol: &str, option: Option<&str>) -> (PathBuf, Servers) {
    std::fs::create_dir_all(dir).unwrap();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let options = option.map_or(String::new(), |o| {
        let (name, value) = o.split_once('=').unwrap();
        format!("[protocol_options]\n\"{name}\" = \"{value}\"\n")
    });
    let text = format!(
        r#"
protocol = "{protocol}"
workload = "bank"
shards = {SHARDS}
replicas = 1
network = "lan"
insecure = true
keys_per_shard = {ACCOUNTS_PER_SHARD}
{options}
[[node]]
id = 0
region = "r0"
addr = "127.0.0.1:{}"
replicas = [[0, 0]]

[[node]]
id = 1
region = "r0"
addr = "127.0.0.1:{}"
replicas = [[1, 0]]

[[node]]
id = 2
region = "r0"
addr = "127.0.0.1:{}"
coordinator = true

[[node]]
id = 3
region = "r0"
addr = "127.0.0.1:{}"
coordinator = true
"#,
        ports[0], ports[1], ports[2], ports[3]
    );
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    let servers = (0..2)
        .map(|node| {
            meridian()
                .args(["server", "--durability", "memory", "--node", &node.to_string()])
                .arg("--config")
                .arg(&file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let servers = Servers(servers);
    wait_for_port(ports[0]);
    wait_for_port(ports[1]);
    (file, servers)
}

fn account(n: u64) -> Key {
    Key::table(3).u64(n).build()
}

fn cents(value: &Option<Vec<u8>>) -> i64 {
    i64::from_le_bytes(value.as_ref().expect("every account exists")[..8].try_into().unwrap())
}

/// Moves `amount` from `from` to `to` in one interactive transaction, retried when aborted.
/// Returns the aborts it took.
async fn transfer(client: &Client, from: u64, to: u64, amount: i64) -> u32 {
    let mut aborts = 0;
    loop {
        let mut txn = client.begin().await.expect("begin");
        let result = async {
            let balances = txn.get_many(&[account(from), account(to)]).await?;
            let (a, b) = (cents(&balances[0]), cents(&balances[1]));
            let amount = amount.min(a);
            txn.put(account(from), (a - amount).to_le_bytes().to_vec())?;
            // Read-your-writes: the transaction sees its own write without asking anyone.
            assert_eq!(cents(&txn.get(&account(from)).await?), a - amount);
            txn.put(account(to), (b + amount).to_le_bytes().to_vec())?;
            txn.commit().await
        }
        .await;
        match result {
            Ok(_) => return aborts,
            Err(error) if error.is_retryable() => aborts += 1,
            Err(error) => panic!("transfer {from} -> {to}: {error}"),
        }
        assert!(aborts < 2_000, "transfer {from} -> {to} starved");
        backoff(aborts, from).await;
    }
}

/// The same transfer through the client's retry helper ([`Client::transact`]).
async fn transfer_with_helper(client: &Client, from: u64, to: u64, amount: i64) {
    client
        .transact(|txn| {
            Box::pin(async move {
                let balances = txn.get_many(&[account(from), account(to)]).await?;
                let (a, b) = (cents(&balances[0]), cents(&balances[1]));
                let amount = amount.min(a);
                txn.put(account(from), (a - amount).to_le_bytes().to_vec())?;
                txn.put(account(to), (b + amount).to_le_bytes().to_vec())?;
                Ok(())
            })
        })
        .await
        .unwrap_or_else(|e| panic!("transfer {from} -> {to}: {e}"));
}

/// Waits before retry `aborts` of the transfer from `from`: growing with the aborts and
/// different per account, so that transfers that refuse each other's locks (2PL no-wait: both
/// read both accounts, then neither can upgrade) do not retry in lockstep forever.
async fn backoff(aborts: u32, from: u64) {
    let micros = (50u64 << aborts.min(6)) + 37 * (from % 8);
    tokio::time::sleep(Duration::from_micros(micros)).await;
}

/// Every account's balance, read in one transaction.
async fn audit(client: &Client) -> Vec<i64> {
    loop {
        let mut txn = client.begin().await.expect("begin");
        let keys: Vec<Key> = (0..SHARDS * ACCOUNTS_PER_SHARD).map(account).collect();
        match txn.get_many(&keys).await {
            Ok(values) => {
                txn.commit().await.ok();
                return values.iter().map(cents).collect();
            }
            Err(error) if error.is_retryable() => continue,
            Err(error) => panic!("audit: {error}"),
        }
    }
}

fn run_protocol(protocol: &str, option: Option<&str>) {
    let label = format!("{protocol}{}", option.map_or(String::new(), |o| format!("-{o}")));
    let dir =
        std::env::temp_dir().join(format!("meridian-interactive-{}-{label}", std::process::id()));
    let (file, _servers) = cluster(&dir, protocol, option);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // Patient retries: eight workers over eight accounts refuse each other often.
        let retry = Retry {
            attempts_max: 1_000,
            backoff_min: Duration::from_micros(50),
            backoff_max: Duration::from_millis(5),
        };
        let client = Client::connect_with(&file, Options { retry, ..Options::default() })
            .await
            .expect("connect");
        assert_eq!(client.protocol(), protocol);
        // Concurrent transfers over few accounts: conflicts, and some cross-shard. Half the
        // workers retry by hand, half through the retry helper.
        let accounts = SHARDS * ACCOUNTS_PER_SHARD;
        let mut tasks = Vec::new();
        for worker in 0..8u64 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut seed = worker * 7_919 + 13;
                let mut aborts = 0;
                for _ in 0..15 {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let from = (seed >> 33) % accounts;
                    let to = (from + 1 + (seed >> 40) % (accounts - 1)) % accounts;
                    let amount = 1 + (seed >> 50) as i64 % 500;
                    if worker % 2 == 0 {
                        aborts += transfer(&client, from, to, amount).await;
                    } else {
                        transfer_with_helper(&client, from, to, amount).await;
                    }
                }
                aborts
            }));
        }
        let mut aborts = 0;
        for task in tasks {
            aborts += task.await.expect("a transfer task");
        }
        let balances = audit(&client).await;
        assert!(balances.iter().all(|&b| b >= 0), "{label}: {balances:?}");
        assert_eq!(
            balances.iter().sum::<i64>(),
            INITIAL_CENTS * accounts as i64,
            "{label}: the total moved ({aborts} aborts): {balances:?}"
        );
        assert_ne!(balances, vec![INITIAL_CENTS; accounts as usize], "{label}: nothing moved");

        // After the end, every operation is refused and changes nothing.
        let mut txn = client.begin().await.unwrap();
        txn.put(account(0), 1i64.to_le_bytes().to_vec()).unwrap();
        txn.abort().await.unwrap();
        assert!(matches!(txn.get(&account(0)).await, Err(Error::Finished(_))));
        assert!(matches!(txn.put(account(0), vec![]), Err(Error::Finished(_))));
        assert!(matches!(txn.commit().await, Err(Error::Finished(_))));
        drop(txn);
        let mut txn = client.begin().await.unwrap();
        let reversed = txn.scan(account(5), account(1), 10, false).await;
        assert!(
            matches!(&reversed, Err(Error::BadRequest(why)) if why.contains("reversed")),
            "{reversed:?}"
        );
        let rows = txn.scan(account(0), account(accounts), 100, false).await.unwrap();
        assert_eq!(rows.len() as u64, accounts, "a scan over both shards sees every account");
        assert_eq!(
            rows.iter().map(|(_, v)| cents(&Some(v.clone()))).sum::<i64>(),
            balances.iter().sum::<i64>()
        );
        txn.commit().await.unwrap();
        drop(txn);

        // A transaction moves into another task and commits there.
        let mut txn = client.begin().await.unwrap();
        let moved = tokio::spawn(async move {
            let balance = cents(&txn.get(&account(2)).await?);
            txn.put(account(2), balance.to_le_bytes().to_vec())?;
            txn.commit().await
        });
        moved.await.expect("the task ran").expect("a rewrite of one balance commits");

        // A client that vanishes mid-transaction (no commit, no abort) holds nothing once the
        // lease has passed: a second client writes the same account.
        let mut txn = client.begin().await.unwrap();
        txn.get(&account(0)).await.unwrap();
        std::mem::forget(txn);
        client.close().await;
        let other = Client::connect_with(&file, Options { node: Some(3), ..Options::default() })
            .await
            .unwrap();
        let started = Instant::now();
        let aborts = transfer(&other, 0, 1, 1).await;
        assert!(started.elapsed() < Duration::from_secs(20), "{label}: {aborts} aborts");
        other.close().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_interactive_transfers_keep_the_total_under_occ() {
    run_protocol("occ", None);
}

#[test]
fn concurrent_interactive_transfers_keep_the_total_under_2pl() {
    run_protocol("2pl", Some("2pl-policy=no-wait"));
    run_protocol("2pl", Some("2pl-policy=wound-wait"));
}

#[test]
fn concurrent_interactive_transfers_keep_the_total_under_2pc_mvto() {
    run_protocol("2pc-mvto", None);
}

#[test]
fn kv_runs_statements_as_one_transaction_and_refuses_bad_ones_before_starting() {
    let dir = std::env::temp_dir().join(format!("meridian-interactive-kv-{}", std::process::id()));
    let (file, _servers) = cluster(&dir, "occ", None);
    let kv = |statements: &str| {
        meridian().arg("kv").arg("--config").arg(&file).args(["txn", statements]).output().unwrap()
    };
    let output = kv("get t3:1 t3:5; put t3:1 i64:9000; put t3:5 i64:11000; get t3:1; commit");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("t3:1 = 0x1027000000000000 (i64:10000)"), "{stdout}");
    assert!(stdout.contains("t3:1 = 0x2823000000000000 (i64:9000)"), "read-your-writes: {stdout}");
    assert!(stdout.contains("committed at"), "{stdout}");
    // A bad statement anywhere: exit 2, named, and nothing ran (the put did not apply).
    let output = kv("put t3:1 i64:1; scan t3:5 t3:1; commit");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("statement 2 (scan t3:5 t3:1): scan range reversed"), "{stderr}");
    for bad in ["get", "put a", "frobnicate x", "commit; get a", "put a 0xabc"] {
        let output = kv(bad);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert_eq!(String::from_utf8_lossy(&output.stderr).lines().count(), 1, "{bad}");
    }
    // A transaction that never commits promises nothing about what it read (occ validates
    // reads at commit, and a shard may still hold the first commit prepared: its coordinator
    // acknowledged it before every shard applied it). One that commits reads it.
    // Ending without `commit` fails (exit 1), saying so: nothing was applied.
    let output = kv("get t3:1 t3:5");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no commit"));
    let started = Instant::now();
    let stdout = loop {
        let output = kv("get t3:1 t3:5; commit");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if stdout.contains("committed at") || started.elapsed() > Duration::from_secs(10) {
            break stdout;
        }
    };
    assert!(stdout.contains("t3:1 = 0x2823000000000000 (i64:9000)"), "{stdout}");
    assert!(stdout.contains("t3:5 = 0xf82a000000000000 (i64:11000)"), "{stdout}");

    // Standard input: `;` separates statements there too, and a quoted value is text.
    let piped = |args: &[&str], input: &str| {
        use std::io::Write;
        let mut child = meridian()
            .arg("kv")
            .arg("--config")
            .arg(&file)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let output = piped(&["txn"], "put note \"hello; world\"; get note; commit\n");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("note = \"hello; world\""), "{stdout}");
    assert!(stdout.contains("committed at"), "{stdout}");
    // A mistyped number is refused, not stored as text.
    let output = kv("put frank i46:5; commit");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("i46: is no value type"));

    // A session: statements run as lines come; a bad line or a failed statement is reported
    // and the session goes on; `commit` ends a transaction and the next begins anew.
    let session = "put greeting \"hi there\"\nfrobnicate\nput x i46:5\ncommit\n\
                   get greeting; commit\nget greeting; quit\nhelp\nquit\nget never\n";
    let output = piped(&["txn", "--interactive"], session);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("kv> put greeting \"hi there\""), "{stdout}");
    assert!(stdout.contains("kv txn> frobnicate"), "the transaction stays open: {stdout}");
    assert!(stdout.contains("unknown statement"), "{stdout}");
    assert!(stdout.contains("i46: is no value type"), "{stdout}");
    assert_eq!(stdout.matches("committed at").count(), 2, "{stdout}");
    assert!(stdout.contains("greeting = \"hi there\""), "{stdout}");
    assert!(stdout.contains("stand alone on their line"), "{stdout}");
    assert!(stdout.contains("statements: get K"), "help: {stdout}");
    assert!(!stdout.contains("never"), "nothing after quit: {stdout}");
    // A session that ends with a transaction open fails, as a script does.
    let output = piped(&["txn", "--interactive"], "put y 1\n");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no commit"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A read from a shard whose server is gone ends, after the client's time limit, with a
/// retryable timeout naming the shard and its server, instead of hanging; a commit that
/// needs that shard is never reached.
#[test]
fn an_unanswered_read_times_out_naming_its_shard_and_server() {
    let dir = std::env::temp_dir().join(format!("meridian-interactive-to-{}", std::process::id()));
    let (file, mut servers) = cluster(&dir, "occ", None);
    let text = std::fs::read_to_string(&file).unwrap();
    let shard_1_addr =
        text.split("addr = \"").nth(2).unwrap().split('"').next().unwrap().to_string();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let timeout = Duration::from_millis(700);
        let options = Options { timeout: Some(timeout), ..Options::default() };
        let client = Client::connect_with(&file, options).await.expect("connect");
        // Shard 1's only server goes away.
        let _ = servers.0[1].kill();
        let _ = servers.0[1].wait();
        let mut txn = client.begin().await.expect("begin");
        // Account 0 is on shard 0 (served), the last one on shard 1 (gone).
        let started = Instant::now();
        let gone = account(SHARDS * ACCOUNTS_PER_SHARD - 1);
        let error = txn.get_many(&[account(0), gone]).await.expect_err("shard 1 never answers");
        assert!(started.elapsed() < timeout * 4, "{:?}", started.elapsed());
        match &error {
            Error::Timeout { shards, servers, .. } => {
                assert!(shards.contains(&1), "{error}");
                assert!(servers.iter().any(|s| s.to_string() == shard_1_addr), "{error}");
            }
            other => panic!("not a timeout: {other}"),
        }
        assert!(error.is_retryable(), "nothing was applied");
        assert!(matches!(txn.get(&account(0)).await, Err(Error::Finished(_))));
        client.close().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client pointed at servers of another cluster, at a port that is no Meridian server, or
/// at a cluster with a shard whose servers are all down gets one clear error at connect,
/// naming the node and address, instead of timeouts later.
#[test]
fn a_client_of_the_wrong_cluster_or_port_is_told_at_connect() {
    let dir =
        std::env::temp_dir().join(format!("meridian-interactive-probe-{}", std::process::id()));
    let (file, mut servers) = cluster(&dir, "occ", None);
    let text = std::fs::read_to_string(&file).unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let connect =
        |path: &Path| rt.block_on(Client::connect(path)).map(|_| ()).unwrap_err().to_string();
    // Another cluster file (a different seed) at the same addresses: its hello is refused.
    let other = dir.join("other.toml");
    std::fs::write(&other, text.replacen("keys_per_shard", "seed = 99\nkeys_per_shard", 1))
        .unwrap();
    let error = connect(&other);
    assert!(error.contains("refused this client's hello"), "{error}");
    // A port that talks first is no Meridian server.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let squatter_addr = squatter.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut stream in squatter.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = stream.write_all(b"SSH-2.0-not-meridian\r\n");
                std::thread::sleep(Duration::from_millis(2_000));
            });
        }
    });
    let first_addr = text.split("addr = \"").nth(1).unwrap().split('"').next().unwrap();
    let wrong = dir.join("wrong.toml");
    std::fs::write(&wrong, text.replacen(first_addr, &squatter_addr.to_string(), 1)).unwrap();
    let error = connect(&wrong);
    assert!(error.contains("not a Meridian server") && error.contains("node 0"), "{error}");
    // Shard 1's only server down: no reachable server for it.
    let _ = servers.0[1].kill();
    let _ = servers.0[1].wait();
    let error = connect(&file);
    assert!(error.contains("shard 1 has no reachable server"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}
