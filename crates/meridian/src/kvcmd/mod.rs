//! `meridian kv`: transactions against a running cluster, through the client library
//! (`meridian-client`).
//!
//! Statements given as arguments, or piped on standard input, are a script: every statement
//! is parsed before anything runs (a bad one is reported with its number and text, exit 2,
//! nothing sent), and they run as one transaction that commits only at an explicit `commit`;
//! one that fails, or ends without `commit`, leaves nothing applied and exits 1. With a
//! terminal on standard input (or `--interactive`), `kv txn` is a session: a prompt, line
//! editing and history, statements run as they are entered ([`session`]). How statements are
//! written is in [`parse`].

mod parse;
mod session;

use crate::Failure;
use clap::Args;
use meridian_client::{Client, Options};
use meridian_core::ConfigError;
use std::io::{BufRead, IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

/// Bytes read from standard input at most (a script).
const STDIN_BYTES_MAX: u64 = 16 << 20;
/// Bytes of one piped interactive line at most.
const LINE_BYTES_MAX: u64 = 1 << 20;
/// Lines an interactive session's history keeps.
const HISTORY_LINES_MAX: usize = 1_000;

#[derive(Args)]
pub struct KvArgs {
    /// The cluster file (as for `meridian server` and `bench --cluster`).
    #[arg(long)]
    config: PathBuf,
    /// The coordinator node of the file to run in this process (default: the first one that
    /// hosts no replica).
    #[arg(long)]
    node: Option<u32>,
    /// How long the transaction may stay idle before its coordinator aborts it (ms).
    #[arg(long)]
    lease_ms: Option<u64>,
    /// A session with a prompt even when standard input is not a terminal: statements run as
    /// each line comes, and a bad or failed one does not end the session.
    #[arg(long)]
    interactive: bool,
    /// `txn`, then statements separated by `;` (or none: statements from standard input, a
    /// session when it is a terminal). Statements: `get K [K ...]`, `put K V`, `delete K`,
    /// `scan START END [LIMIT] [reverse]`, `commit`, `abort`. A key is text (table 240),
    /// `0xHEX` (raw bytes) or `tT:N[:N...]` (table T, then big-endian u64s, e.g. `t3:7` is
    /// bank account 7); a value is text, `0xHEX` or `i64:N` (little-endian, as balances). A
    /// word in double quotes is text, whatever it holds: `put k "hello world"`.
    #[arg(required = true, num_args = 1.., value_name = "txn STATEMENTS")]
    words: Vec<String>,
}

/// An interactive session's lines from a terminal: rustyline's editor (line editing, and
/// history kept for the session).
struct Terminal(rustyline::DefaultEditor);

impl session::Lines for Terminal {
    fn read(&mut self, prompt: &str) -> Option<String> {
        // The editor blocks on the terminal; the client's node runs on threads of its own.
        let line = tokio::task::block_in_place(|| self.0.readline(prompt));
        match line {
            Ok(line) => {
                let _ = self.0.add_history_entry(line.as_str());
                Some(line)
            }
            // Ctrl-C and Ctrl-D leave, as the end of a pipe does.
            Err(_) => None,
        }
    }
}

/// An interactive session's lines from a pipe (`--interactive`), each echoed after its
/// prompt so that the transcript reads as a terminal's would.
struct Piped(std::io::StdinLock<'static>);

impl session::Lines for Piped {
    fn read(&mut self, prompt: &str) -> Option<String> {
        let mut line = String::new();
        let read =
            tokio::task::block_in_place(|| (&mut self.0).take(LINE_BYTES_MAX).read_line(&mut line));
        match read {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                let line = line.trim_end_matches(['\n', '\r']).to_string();
                println!("{prompt}{line}");
                Some(line)
            }
        }
    }
}

/// The line source of a session on this process's standard input.
fn session_lines() -> Result<Box<dyn session::Lines>, Failure> {
    if !std::io::stdin().is_terminal() {
        return Ok(Box::new(Piped(std::io::stdin().lock())));
    }
    let editor_failed = |e: rustyline::error::ReadlineError| {
        Failure::Run(format!("cannot start the line editor: {e}"))
    };
    let config = rustyline::Config::builder()
        .max_history_size(HISTORY_LINES_MAX)
        .map_err(editor_failed)?
        .auto_add_history(false)
        .build();
    let editor = rustyline::DefaultEditor::with_config(config).map_err(editor_failed)?;
    Ok(Box::new(Terminal(editor)))
}

pub fn kv(args: &KvArgs) -> Result<(), Failure> {
    let Some((first, rest)) = args.words.split_first() else {
        return Err(ConfigError::new("give `txn` and statements").into());
    };
    if first != "txn" {
        return Err(ConfigError::new(format!("unknown kv command {first:?}; accepted: txn")).into());
    }
    if args.lease_ms == Some(0) {
        return Err(ConfigError::new("--lease-ms must be positive").into());
    }
    let interactive = args.interactive || (rest.is_empty() && std::io::stdin().is_terminal());
    if interactive && !rest.is_empty() {
        return Err(ConfigError::new(
            "--interactive takes its statements from standard input, not as arguments",
        )
        .into());
    }
    // A script is parsed whole before anything connects.
    let script = match (interactive, rest.is_empty()) {
        (true, _) => None,
        (false, true) => {
            let mut input = String::new();
            std::io::stdin()
                .take(STDIN_BYTES_MAX)
                .read_to_string(&mut input)
                .map_err(|e| ConfigError::new(format!("standard input: {e}")))?;
            Some(parse::parse_all(&input).map_err(ConfigError::new)?)
        }
        (false, false) => Some(parse::parse_all(&rest.join(" ")).map_err(ConfigError::new)?),
    };
    let mut lines = if script.is_none() { Some(session_lines()?) } else { None };
    let options = Options {
        node: args.node,
        lease: args.lease_ms.map(Duration::from_millis),
        ..Options::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Run(format!("cannot start a runtime: {e}")))?;
    rt.block_on(async {
        let client = Client::connect_with(&args.config, options)
            .await
            .map_err(|e| Failure::Input(ConfigError::new(e.to_string())))?;
        let result = match (&script, lines.as_mut()) {
            (Some(statements), _) => session::run_script(&client, statements).await,
            (None, Some(lines)) => session::run_interactive(&client, lines.as_mut()).await,
            (None, None) => Err(Failure::Run("no statements and no session".into())),
        };
        client.close().await;
        result
    })
}
