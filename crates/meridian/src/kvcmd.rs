//! `meridian kv`: an interactive transaction against a running cluster, from statements given
//! as arguments or read from standard input.
//!
//! Every statement is parsed before anything runs: a bad one is reported with its number and
//! text (exit 2) and nothing is sent. The statements run as one transaction through the
//! client library (`meridian-client`); it commits only at an explicit `commit`, so a
//! transaction that fails or ends without one leaves nothing applied.

use crate::Failure;
use clap::Args;
use meridian_client::{Client, Error, Key, Options, Value};
use meridian_core::ConfigError;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// Statements one invocation may run.
const STATEMENTS_MAX: usize = 10_000;
/// Bytes read from standard input at most.
const STDIN_BYTES_MAX: u64 = 16 << 20;
/// Rows a scan returns when no limit is given.
const SCAN_LIMIT_DEFAULT: u32 = 100;
/// The table of plain-text keys: `name` is the key `240 ‖ name` (its bytes, unescaped).
pub const TEXT_TABLE: u8 = 240;

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
    /// `txn`, then statements separated by `;` (or none: one statement per line of standard
    /// input). Statements: `get K [K ...]`, `put K V`, `delete K`,
    /// `scan START END [LIMIT] [reverse]`, `commit`, `abort`. A key is text (table 240),
    /// `0xHEX` (raw bytes) or `tT:N[:N...]` (table T, then big-endian u64s, e.g. `t3:7` is
    /// bank account 7); a value is text, `0xHEX` or `i64:N` (little-endian, as balances).
    #[arg(required = true, num_args = 1.., value_name = "txn STATEMENTS")]
    words: Vec<String>,
}

/// One parsed statement.
#[derive(Clone, Debug, PartialEq)]
enum Statement {
    Get(Vec<Key>),
    Put(Key, Value),
    Delete(Key),
    Scan { start: Key, end: Key, limit: u32, reverse: bool },
    Commit,
    Abort,
}

fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits = text.as_bytes();
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(format!("0x{text}: not hex"));
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!("0x{text}: an odd number of hex digits"));
    }
    let value = |d: u8| (d as char).to_digit(16).expect("checked above") as u8;
    Ok(digits.chunks(2).map(|pair| (value(pair[0]) << 4) | value(pair[1])).collect())
}

fn parse_key(word: &str) -> Result<Key, String> {
    if let Some(hex) = word.strip_prefix("0x") {
        return Ok(Key::from(parse_hex(hex)?));
    }
    if let Some(rest) = word.strip_prefix('t') {
        if let Some((table, parts)) = rest.split_once(':') {
            if let Ok(table) = table.parse::<u8>() {
                let mut key = Key::table(table);
                for part in parts.split(':') {
                    let n = part
                        .parse::<u64>()
                        .map_err(|_| format!("{word}: {part:?} is not an unsigned integer"))?;
                    key = key.u64(n);
                }
                return Ok(key.build());
            }
        }
    }
    if word.is_empty() {
        return Err("an empty key".into());
    }
    // Unescaped, so that text keys scan in text order (`scan a b` holds every key from `a`).
    Ok(Key::from([&[TEXT_TABLE], word.as_bytes()].concat()))
}

fn parse_value(word: &str) -> Result<Value, String> {
    if let Some(hex) = word.strip_prefix("0x") {
        return parse_hex(hex);
    }
    if let Some(n) = word.strip_prefix("i64:") {
        let n = n.parse::<i64>().map_err(|_| format!("{word}: not a signed integer"))?;
        return Ok(n.to_le_bytes().to_vec());
    }
    Ok(word.as_bytes().to_vec())
}

fn parse_statement(text: &str) -> Result<Statement, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some((&verb, rest)) = words.split_first() else { return Err("empty".into()) };
    let arity = |n: usize, usage: &str| {
        if rest.len() == n {
            Ok(())
        } else {
            Err(format!("usage: {usage}"))
        }
    };
    Ok(match verb.to_ascii_lowercase().as_str() {
        "get" => {
            if rest.is_empty() {
                return Err("usage: get KEY [KEY ...]".into());
            }
            Statement::Get(rest.iter().map(|w| parse_key(w)).collect::<Result<_, _>>()?)
        }
        "put" => {
            arity(2, "put KEY VALUE")?;
            Statement::Put(parse_key(rest[0])?, parse_value(rest[1])?)
        }
        "delete" => {
            arity(1, "delete KEY")?;
            Statement::Delete(parse_key(rest[0])?)
        }
        "scan" => {
            let usage = "usage: scan START END [LIMIT] [reverse]";
            if !(2..=4).contains(&rest.len()) {
                return Err(usage.into());
            }
            let (start, end) = (parse_key(rest[0])?, parse_key(rest[1])?);
            if start > end {
                return Err(format!("scan range reversed: {} is after {}", rest[0], rest[1]));
            }
            let mut limit = SCAN_LIMIT_DEFAULT;
            let mut reverse = false;
            for word in &rest[2..] {
                if word.eq_ignore_ascii_case("reverse") {
                    reverse = true;
                } else {
                    limit = word
                        .parse::<u32>()
                        .ok()
                        .filter(|&l| l > 0 && l <= meridian_core::txn::SCAN_ROWS_MAX)
                        .ok_or_else(|| format!("limit {word}: give 1..=10000, or `reverse`"))?;
                }
            }
            Statement::Scan { start, end, limit, reverse }
        }
        "commit" => {
            arity(0, "commit")?;
            Statement::Commit
        }
        "abort" | "rollback" => {
            arity(0, "abort")?;
            Statement::Abort
        }
        "begin" => return Err("the statements are one transaction already: drop `begin`".into()),
        other => {
            return Err(format!(
                "unknown statement {other:?}; accepted: get, put, delete, scan, commit, abort"
            ))
        }
    })
}

/// Parses every statement; the first bad one is the error, with its number and text.
fn parse_all(texts: &[String]) -> Result<Vec<Statement>, String> {
    let texts: Vec<&str> =
        texts.iter().map(|t| t.trim()).filter(|t| !t.is_empty() && !t.starts_with('#')).collect();
    if texts.is_empty() {
        return Err("no statements".into());
    }
    if texts.len() > STATEMENTS_MAX {
        return Err(format!("{} statements is over {STATEMENTS_MAX}", texts.len()));
    }
    let mut statements = Vec::with_capacity(texts.len());
    for (index, text) in texts.iter().enumerate() {
        let statement =
            parse_statement(text).map_err(|e| format!("statement {} ({text}): {e}", index + 1))?;
        if let Some(Statement::Commit | Statement::Abort) = statements.last() {
            return Err(format!(
                "statement {} ({text}): the transaction already ended at statement {}",
                index + 1,
                index
            ));
        }
        statements.push(statement);
    }
    Ok(statements)
}

/// A key as the user may type it back.
fn show_key(key: &Key) -> String {
    let bytes = key.as_bytes();
    if bytes.first() == Some(&TEXT_TABLE) && bytes[1..].iter().all(|b| b.is_ascii_graphic()) {
        return String::from_utf8_lossy(&bytes[1..]).into_owned();
    }
    if bytes.len() > 1 && (bytes.len() - 1).is_multiple_of(8) {
        let parts: Vec<String> = bytes[1..]
            .chunks(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")).to_string())
            .collect();
        return format!("t{}:{}", bytes[0], parts.join(":"));
    }
    format!("0x{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn show_value(value: &[u8]) -> String {
    if !value.is_empty() && value.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return format!("{:?}", String::from_utf8_lossy(value));
    }
    let hex = format!("0x{}", value.iter().map(|b| format!("{b:02x}")).collect::<String>());
    match <[u8; 8]>::try_from(value) {
        Ok(bytes) => format!("{hex} (i64:{})", i64::from_le_bytes(bytes)),
        Err(_) => hex,
    }
}

pub fn kv(args: &KvArgs) -> Result<(), Failure> {
    let Some((first, rest)) = args.words.split_first() else {
        return Err(ConfigError::new("give `txn` and statements").into());
    };
    if first != "txn" {
        return Err(ConfigError::new(format!("unknown kv command {first:?}; accepted: txn")).into());
    }
    let texts: Vec<String> = if rest.is_empty() {
        let mut input = String::new();
        std::io::stdin()
            .take(STDIN_BYTES_MAX)
            .read_to_string(&mut input)
            .map_err(|e| ConfigError::new(format!("standard input: {e}")))?;
        input.lines().map(String::from).collect()
    } else {
        rest.join(" ").split(';').map(String::from).collect()
    };
    let statements = parse_all(&texts).map_err(ConfigError::new)?;
    if args.lease_ms == Some(0) {
        return Err(ConfigError::new("--lease-ms must be positive").into());
    }
    let options = Options { node: args.node, lease: args.lease_ms.map(Duration::from_millis) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Run(format!("cannot start a runtime: {e}")))?;
    rt.block_on(async {
        let client = Client::connect_with(&args.config, options)
            .await
            .map_err(|e| Failure::Input(ConfigError::new(e.to_string())))?;
        let result = run_statements(&client, &statements).await;
        client.close().await;
        result
    })
}

async fn run_statements(client: &Client, statements: &[Statement]) -> Result<(), Failure> {
    let failed = |index: usize, e: Error| Failure::Run(format!("statement {}: {e}", index + 1));
    let mut txn = client.begin().await.map_err(|e| Failure::Run(e.to_string()))?;
    for (index, statement) in statements.iter().enumerate() {
        match statement {
            Statement::Get(keys) => {
                let values = txn.get_many(keys).await.map_err(|e| failed(index, e))?;
                for (key, value) in keys.iter().zip(values) {
                    match value {
                        Some(v) => println!("{} = {}", show_key(key), show_value(&v)),
                        None => println!("{} absent", show_key(key)),
                    }
                }
            }
            Statement::Put(key, value) => {
                txn.put(key.clone(), value.clone()).map_err(|e| failed(index, e))?;
                println!("put {} = {}", show_key(key), show_value(value));
            }
            Statement::Delete(key) => {
                txn.delete(key.clone()).map_err(|e| failed(index, e))?;
                println!("delete {}", show_key(key));
            }
            Statement::Scan { start, end, limit, reverse } => {
                let rows = txn
                    .scan(start.clone(), end.clone(), *limit, *reverse)
                    .await
                    .map_err(|e| failed(index, e))?;
                println!("scan: {} rows", rows.len());
                for (key, value) in rows {
                    println!("  {} = {}", show_key(&key), show_value(&value));
                }
            }
            Statement::Commit => {
                let ts = txn.commit().await.map_err(|e| failed(index, e))?;
                match ts {
                    Some(ts) => println!("committed at {}", ts.0),
                    None => println!("committed (nothing read or written)"),
                }
                return Ok(());
            }
            Statement::Abort => {
                txn.abort().await.map_err(|e| failed(index, e))?;
                println!("aborted: nothing was applied");
                return Ok(());
            }
        }
    }
    txn.abort().await.map_err(|e| Failure::Run(e.to_string()))?;
    println!("no commit: aborted, nothing was applied");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_parse_and_bad_ones_name_themselves() {
        let texts: Vec<String> =
            ["get a t3:7", "put a i64:5", "delete 0x00ff", "scan a b 10 reverse", "commit"]
                .map(String::from)
                .to_vec();
        let statements = parse_all(&texts).unwrap();
        assert_eq!(statements.len(), 5);
        assert_eq!(
            statements[0],
            Statement::Get(vec![Key::from(vec![TEXT_TABLE, b'a']), Key::table(3).u64(7).build()])
        );
        assert_eq!(
            statements[1],
            Statement::Put(parse_key("a").unwrap(), 5i64.to_le_bytes().to_vec())
        );
        assert_eq!(statements[2], Statement::Delete(Key::from(vec![0, 255])));
        assert!(matches!(statements[3], Statement::Scan { limit: 10, reverse: true, .. }));
        let bad = |lines: &[&str]| {
            parse_all(&lines.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err()
        };
        assert!(
            bad(&["get a", "put a"]).starts_with("statement 2 (put a): usage"),
            "{}",
            bad(&["get a", "put a"])
        );
        assert!(bad(&["scan b a"]).contains("reversed"));
        assert!(bad(&["commit", "get a"]).contains("already ended"));
        assert!(bad(&["frobnicate"]).contains("unknown statement"));
        assert!(bad(&["put a 0xabc"]).contains("odd number"));
        assert!(bad(&["get 0x€1"]).contains("not hex"), "a multi-byte character is not a digit");
        assert!(bad(&["get 0x+1+2"]).contains("not hex"));
        assert_eq!(parse_key("0x00fF").unwrap(), Key::from(vec![0, 255]));
        assert!(bad(&["scan a b 0"]).contains("limit"));
        assert!(bad(&[]).contains("no statements"));
        assert_eq!(show_key(&parse_key("t3:7").unwrap()), "t3:7");
        assert_eq!(show_key(&parse_key("alice").unwrap()), "alice");
        assert_eq!(show_value(&5i64.to_le_bytes()), "0x0500000000000000 (i64:5)");
    }
}
