//! A PostgreSQL server of the harness's own: `initdb` into a fresh temporary directory, start
//! `postgres` on a free loopback port with settings written for benchmarking, and on drop stop
//! it (fast shutdown, then a kill if it lingers) and remove the directory, so a run never
//! leaves a server process or a data directory behind.
//!
//! PostgreSQL refuses to run as root; when this process is root, `initdb` and `postgres` run
//! as the `postgres` system user (created by the distribution's packages).

use meridian_runtime::logstore::DurabilityMode;
use std::net::TcpListener;
use std::os::unix::fs::{chown, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server has to accept connections after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fast shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// The superuser `initdb` creates (trusted on loopback only).
pub const USER: &str = "meridian";
/// The system user servers run as when this process is root.
const SYSTEM_USER: &str = "postgres";
/// Bytes of the server log quoted in an error.
const LOG_TAIL_BYTES: usize = 2_000;

/// Where PostgreSQL's programs are: `MERIDIAN_PG_BINDIR`, else `pg_config --bindir`, else
/// the newest `/usr/lib/postgresql/*/bin`.
pub fn find_bindir() -> Result<PathBuf, String> {
    let has_postgres = |dir: &Path| dir.join("postgres").is_file() && dir.join("initdb").is_file();
    if let Some(dir) = std::env::var_os("MERIDIAN_PG_BINDIR").map(PathBuf::from) {
        return if has_postgres(&dir) {
            Ok(dir)
        } else {
            Err(format!("MERIDIAN_PG_BINDIR={} has no postgres and initdb programs", dir.display()))
        };
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_postgres(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_postgres(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL is not installed: no postgres/initdb under MERIDIAN_PG_BINDIR, \
         pg_config --bindir or /usr/lib/postgresql/*/bin; install it (apt install postgresql) \
         or give --pg-url of a running server"
            .to_string()
    })
}

/// The settings a started server gets.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Connections allowed (the clients, plus the harness's own).
    pub max_connections: u32,
    /// `fsync`: commits synced (`fsync=on`, `synchronous_commit=on`); `buffered`: the WAL is
    /// written at commit but not synced (survives a process crash, not a power loss);
    /// `memory`: neither (nothing is promised across a crash).
    pub durability: DurabilityMode,
}

impl Settings {
    /// The `-c name=value` settings.
    pub fn options(&self, socket_dir: &Path) -> Vec<(String, String)> {
        let (fsync, synchronous_commit) = match self.durability {
            DurabilityMode::Fsync => ("on", "on"),
            DurabilityMode::Buffered => ("off", "on"),
            DurabilityMode::Memory => ("off", "off"),
        };
        [
            ("listen_addresses", "127.0.0.1".to_string()),
            ("unix_socket_directories", socket_dir.display().to_string()),
            ("max_connections", self.max_connections.to_string()),
            ("shared_buffers", "512MB".into()),
            ("fsync", fsync.into()),
            ("synchronous_commit", synchronous_commit.into()),
            ("full_page_writes", fsync.into()),
            ("max_wal_size", "8GB".into()),
            ("checkpoint_timeout", "30min".into()),
            // A statement stuck for this long (a lock wait the deadlock detector cannot see)
            // fails instead of hanging its client.
            ("statement_timeout", "60s".into()),
            ("max_locks_per_transaction", "256".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A running server in a temporary directory; stopped and removed on drop.
pub struct TempServer {
    child: Option<Child>,
    base: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
    /// Where the server's programs are.
    pub bindir: PathBuf,
}

impl TempServer {
    /// Runs `initdb` and starts the server; waits until it accepts connections.
    pub fn start(settings: Settings) -> Result<Self, String> {
        let bindir = find_bindir()?;
        let run_as = system_user()?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let base = std::env::temp_dir().join(format!("meridian-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
        // From here on, dropping `server` removes the directory (and stops what started).
        let mut server = Self { child: None, base, port: 0, bindir };
        if let Some((uid, gid)) = run_as {
            chown(&server.base, Some(uid), Some(gid)).map_err(|e| {
                format!("cannot hand {} to {SYSTEM_USER}: {e}", server.base.display())
            })?;
        }
        let data = server.base.join("data");
        let mut initdb = Command::new(server.bindir.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            USER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        let out = as_user(&mut initdb, run_as)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", server.bindir.join("initdb").display()))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed ({}): {}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr))
            ));
        }
        server.port = free_port()?;
        let log_path = server.base.join("server.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_err = log.try_clone().map_err(|e| format!("cannot share the log file: {e}"))?;
        let mut postgres = Command::new(server.bindir.join("postgres"));
        postgres.arg("-D").arg(&data).arg("-p").arg(server.port.to_string());
        for (name, value) in settings.options(&server.base) {
            postgres.arg("-c").arg(format!("{name}={value}"));
        }
        postgres.stdin(Stdio::null()).stdout(log).stderr(log_err);
        server.child = Some(
            as_user(&mut postgres, run_as)
                .spawn()
                .map_err(|e| format!("cannot start postgres: {e}"))?,
        );
        server.wait_ready(&log_path)?;
        Ok(server)
    }

    /// Polls the port until the server answers, or fails with the log's tail.
    fn wait_ready(&mut self, log_path: &Path) -> Result<(), String> {
        let started = Instant::now();
        let log = || tail(&std::fs::read_to_string(log_path).unwrap_or_default());
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("postgres exited at start ({status}): {}", log()));
                }
            }
            // The server accepts connections once its log says so; a TCP accept alone can
            // come before it finished recovery.
            if std::fs::read_to_string(log_path)
                .is_ok_and(|text| text.contains("ready to accept connections"))
            {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "postgres did not accept connections within {} s: {}",
                    START_TIMEOUT.as_secs(),
                    log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connection configuration for this server.
    pub fn config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(self.port).user(USER).dbname("postgres");
        config
    }

    /// The data directory's parent (removed on drop).
    pub fn base_dir(&self) -> &Path {
        &self.base
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // SIGINT is PostgreSQL's fast shutdown: it rolls back what is open and exits cleanly.
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let started = Instant::now();
        while started.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TempServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// `(uid, gid)` of the system user to run the server as, when this process is root.
fn system_user() -> Result<Option<(u32, u32)>, String> {
    let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    if !root {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| format!("cannot read /etc/passwd: {e}"))?;
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&SYSTEM_USER))
        .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "PostgreSQL will not run as root and there is no '{SYSTEM_USER}' user to run it \
                 as: run as another user, create '{SYSTEM_USER}', or give --pg-url"
            )
        })
}

fn as_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    command
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot find a free loopback port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| format!("cannot read the port: {e}"))
}

fn tail(text: &str) -> String {
    let text = text.trim();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text[start..].replace('\n', " | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_maps_to_fsync_and_synchronous_commit() {
        let get = |d: DurabilityMode, name: &str| {
            let settings = Settings { max_connections: 10, durability: d };
            let options = settings.options(Path::new("/tmp/x"));
            options.into_iter().find(|(n, _)| n == name).map(|(_, v)| v).unwrap()
        };
        assert_eq!(get(DurabilityMode::Fsync, "fsync"), "on");
        assert_eq!(get(DurabilityMode::Fsync, "synchronous_commit"), "on");
        assert_eq!(get(DurabilityMode::Buffered, "fsync"), "off");
        assert_eq!(get(DurabilityMode::Buffered, "synchronous_commit"), "on");
        assert_eq!(get(DurabilityMode::Memory, "synchronous_commit"), "off");
        assert_eq!(get(DurabilityMode::Memory, "max_connections"), "10");
    }

    #[test]
    fn log_tails_are_short_and_on_one_line() {
        let long = "x".repeat(5_000) + "\nlast line";
        let t = tail(&long);
        assert!(t.len() <= LOG_TAIL_BYTES + 3 && t.ends_with("| last line"), "{t}");
    }
}
