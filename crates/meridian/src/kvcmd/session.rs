//! Running `kv`'s statements against the cluster: a script (every statement parsed first, one
//! transaction, and an end without `commit` is a failure), or an interactive session (a
//! prompt; each line's statements parsed, then run at once in the open transaction, which
//! `commit` or `abort` ends and the next statement begins anew).

use super::parse::{self, Statement};
use crate::Failure;
use meridian_client::{Client, Error, Key, Transaction, TEXT_TABLE};

/// How a statement left the transaction.
enum After {
    Open,
    Ended,
}

/// Runs `statement` in `txn`, printing what it read or did.
async fn run_one(txn: &mut Transaction, statement: &Statement) -> Result<After, Error> {
    match statement {
        Statement::Get(keys) => {
            let values = txn.get_many(keys).await?;
            for (key, value) in keys.iter().zip(values) {
                match value {
                    Some(v) => println!("{} = {}", show_key(key), show_value(&v)),
                    None => println!("{} absent", show_key(key)),
                }
            }
        }
        Statement::Put(key, value) => {
            txn.put(key.clone(), value.clone())?;
            println!("put {} = {}", show_key(key), show_value(value));
        }
        Statement::Delete(key) => {
            txn.delete(key.clone())?;
            println!("delete {}", show_key(key));
        }
        Statement::Scan { start, end, limit, reverse } => {
            let rows = txn.scan(start.clone(), end.clone(), *limit, *reverse).await?;
            println!("scan: {} rows", rows.len());
            for (key, value) in rows {
                println!("  {} = {}", show_key(&key), show_value(&value));
            }
        }
        Statement::Commit => {
            match txn.commit().await? {
                Some(ts) => println!("committed at {}", ts.0),
                None => println!("committed (nothing read or written)"),
            }
            return Ok(After::Ended);
        }
        Statement::Abort => {
            txn.abort().await?;
            println!("aborted: nothing was applied");
            return Ok(After::Ended);
        }
    }
    Ok(After::Open)
}

/// The statements given at once, as one transaction. One that ends without `commit` (or
/// `abort`) is aborted, and the invocation fails: a script that forgot its `commit` must not
/// look like one that worked.
pub(super) async fn run_script(client: &Client, statements: &[Statement]) -> Result<(), Failure> {
    let failed = |index: usize, e: Error| Failure::Run(format!("statement {}: {e}", index + 1));
    let mut txn = client.begin().await.map_err(|e| Failure::Run(e.to_string()))?;
    for (index, statement) in statements.iter().enumerate() {
        if let After::Ended = run_one(&mut txn, statement).await.map_err(|e| failed(index, e))? {
            return Ok(());
        }
    }
    txn.abort().await.map_err(|e| Failure::Run(e.to_string()))?;
    Err(Failure::Run(
        "no commit: the statements ended without `commit`, so the transaction was aborted and \
         nothing was applied"
            .into(),
    ))
}

/// Where an interactive session's lines come from (a terminal's line editor, or a pipe).
pub(super) trait Lines {
    /// The next line, shown `prompt`; `None` at the end of input.
    fn read(&mut self, prompt: &str) -> Option<String>;
}

const HELP: &str = "statements: get K [K ...] | put K V | delete K | scan START END [LIMIT] \
                    [reverse] | commit | abort; `;` or a new line between statements; \
                    \"quoted words\" are text; keys: text, 0xHEX, tT:N[:N...]; values: text, \
                    0xHEX, i64:N; `quit` (or end of input) leaves";

/// An interactive session: each line's statements are parsed (a bad one is reported and
/// nothing of its line runs), then run in the open transaction, begun at its first
/// statement. A statement that fails ends its transaction (aborted, nothing applied); the
/// session goes on. Leaving with a transaction open aborts it and fails, as a script does.
pub(super) async fn run_interactive(client: &Client, lines: &mut dyn Lines) -> Result<(), Failure> {
    let mut txn: Option<Transaction> = None;
    'session: while let Some(line) = lines.read(if txn.is_some() { "kv txn> " } else { "kv> " }) {
        let words = match parse::split(&line) {
            Ok(words) => words,
            Err(e) => {
                println!("error: {e}; nothing of the line ran");
                continue;
            }
        };
        // `quit` and `help` are words of the session, alone on their line.
        let verb = |words: &[parse::Word]| match &words[0] {
            w if w.quoted => String::new(),
            w => w.text.to_ascii_lowercase(),
        };
        let session_word = |v: &str| matches!(v, "quit" | "exit" | "help");
        if let [only] = words.as_slice() {
            match verb(only).as_str() {
                "quit" | "exit" if only.len() == 1 => break 'session,
                "help" if only.len() == 1 => {
                    println!("{HELP}");
                    continue;
                }
                _ => {}
            }
        } else if words.iter().any(|w| session_word(&verb(w))) {
            println!("error: `quit` and `help` stand alone on their line; nothing of the line ran");
            continue;
        }
        let mut statements = Vec::with_capacity(words.len());
        for statement in &words {
            match parse::parse_statement(statement) {
                Ok(parsed) => statements.push(parsed),
                Err(e) => {
                    println!("error: {}: {e}; nothing of the line ran", parse::show(statement));
                    statements.clear();
                    break;
                }
            }
        }
        for statement in &statements {
            let open = match txn.as_mut() {
                Some(open) => open,
                None => match client.begin().await {
                    Ok(begun) => txn.insert(begun),
                    Err(e) => {
                        println!("error: cannot begin a transaction: {e}");
                        break;
                    }
                },
            };
            match run_one(open, statement).await {
                Ok(After::Open) => {}
                Ok(After::Ended) => txn = None,
                Err(e) => {
                    // Dropping it aborts whatever the coordinator still holds of it.
                    txn = None;
                    println!("error: {e}; the transaction ended, nothing of it was applied");
                    break;
                }
            }
        }
    }
    match txn.take() {
        None => Ok(()),
        Some(mut open) => {
            open.abort().await.map_err(|e| Failure::Run(e.to_string()))?;
            Err(Failure::Run(
                "no commit: the session ended with a transaction open, so it was aborted and \
                 nothing of it was applied"
                    .into(),
            ))
        }
    }
}

/// A key as the user may type it back.
pub(super) fn show_key(key: &Key) -> String {
    let bytes = key.as_bytes();
    let text_like = |b: &u8| b.is_ascii_graphic() || *b == b' ';
    if bytes.first() == Some(&TEXT_TABLE) && bytes.len() > 1 && bytes[1..].iter().all(text_like) {
        let text = String::from_utf8_lossy(&bytes[1..]).into_owned();
        // Typed back bare, it must read as the same key, in one word.
        let bare = parse::Word { text: text.clone(), quoted: false };
        let one_word = !text.contains([' ', '"', ';', '#', '\\']);
        return match parse::parse_key(&bare) {
            Ok(same) if same == *key && one_word => text,
            _ => format!("{text:?}"),
        };
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

pub(super) fn show_value(value: &[u8]) -> String {
    if !value.is_empty() && value.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return format!("{:?}", String::from_utf8_lossy(value));
    }
    let hex = format!("0x{}", value.iter().map(|b| format!("{b:02x}")).collect::<String>());
    match <[u8; 8]>::try_from(value) {
        Ok(bytes) => format!("{hex} (i64:{})", i64::from_le_bytes(bytes)),
        Err(_) => hex,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::text_key;

    #[test]
    fn keys_and_values_show_as_they_are_typed_back() {
        let typed =
            |text: &str| parse::parse_key(&parse::Word { text: text.into(), quoted: false });
        assert_eq!(show_key(&typed("t3:7").unwrap()), "t3:7");
        assert_eq!(show_key(&typed("alice").unwrap()), "alice");
        // A text key that would read back as something else is shown quoted.
        assert_eq!(show_key(&text_key("x3:1")), "\"x3:1\"");
        assert_eq!(show_key(&text_key("0xab")), "\"0xab\"");
        assert_eq!(show_key(&text_key("a b")), "\"a b\"");
        assert_eq!(show_value(&5i64.to_le_bytes()), "0x0500000000000000 (i64:5)");
        assert_eq!(show_value(b"hello world"), "\"hello world\"");
    }
}
