//! `kv`'s statements: text split into statements and words, then each parsed whole before
//! anything runs.
//!
//! Statements end at `;` or at a line's end, in arguments and on standard input alike. Words
//! are separated by white space; a word in double quotes is text, whatever it holds (spaces,
//! `;`, `#`, something that looks like a type: `put k "i64:5"` stores those five
//! characters), with `\"`, `\\`, `\n` and `\t` as escapes. A statement starting with `#` is
//! a comment. Anything that looks like a typed form but is not one (`i46:5`, `t300:1`) is
//! refused with a hint rather than stored as text: a mistyped number must not become a
//! string without a word.

use meridian_client::{text_key, Key, Value};

/// Statements one text may hold.
pub(super) const STATEMENTS_MAX: usize = 10_000;
/// Rows a scan returns when no limit is given.
const SCAN_LIMIT_DEFAULT: u32 = 100;

/// One word of a statement: its text, and whether it was quoted (then it is text, always).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Word {
    pub(super) text: String,
    pub(super) quoted: bool,
}

/// One parsed statement.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Statement {
    Get(Vec<Key>),
    Put(Key, Value),
    Delete(Key),
    Scan { start: Key, end: Key, limit: u32, reverse: bool },
    Commit,
    Abort,
}

/// Splits `text` into statements of words (empty statements and comments left out).
pub(super) fn split(text: &str) -> Result<Vec<Vec<Word>>, String> {
    let mut statements: Vec<Vec<Word>> = Vec::new();
    let mut words: Vec<Word> = Vec::new();
    let mut word: Option<Word> = None;
    let mut chars = text.chars();
    let mut comment = false;
    fn end(words: &mut Vec<Word>, statements: &mut Vec<Vec<Word>>) {
        if !words.is_empty() {
            statements.push(std::mem::take(words));
        }
    }
    while let Some(c) = chars.next() {
        if comment {
            if c == '\n' {
                comment = false;
            }
            continue;
        }
        match c {
            '"' => {
                if let Some(w) = word.take() {
                    return Err(format!(
                        "a quote inside the word {:?}: put it in quotes whole",
                        w.text
                    ));
                }
                let mut quoted = String::new();
                loop {
                    match chars.next() {
                        None => {
                            let at = statements.len() + 1;
                            return Err(format!("statement {at}: a quote that does not end"));
                        }
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('"') => quoted.push('"'),
                            Some('\\') => quoted.push('\\'),
                            Some('n') => quoted.push('\n'),
                            Some('t') => quoted.push('\t'),
                            other => {
                                return Err(format!(
                                    "an unknown escape \\{} in a quoted word; accepted: \\\" \\\\ \\n \\t",
                                    other.map_or(String::new(), String::from)
                                ))
                            }
                        },
                        Some(other) => quoted.push(other),
                    }
                }
                words.push(Word { text: quoted, quoted: true });
            }
            ';' | '\n' => {
                words.extend(word.take());
                end(&mut words, &mut statements);
            }
            '#' if word.is_none() && words.is_empty() => comment = true,
            c if c.is_whitespace() => words.extend(word.take()),
            c => {
                word.get_or_insert_with(|| Word { text: String::new(), quoted: false }).text.push(c)
            }
        }
        if statements.len() > STATEMENTS_MAX {
            return Err(format!("more than {STATEMENTS_MAX} statements"));
        }
    }
    words.extend(word.take());
    end(&mut words, &mut statements);
    Ok(statements)
}

/// The statement as the user may type it back (for error lines).
pub(super) fn show(words: &[Word]) -> String {
    let shown: Vec<String> = words
        .iter()
        .map(|w| if w.quoted { format!("{:?}", w.text) } else { w.text.clone() })
        .collect();
    shown.join(" ")
}

/// Parses every statement of `text`; the first bad one is the error, with its number and text.
pub(super) fn parse_all(text: &str) -> Result<Vec<Statement>, String> {
    let split = split(text)?;
    if split.is_empty() {
        return Err("no statements".into());
    }
    let mut statements = Vec::with_capacity(split.len());
    for (index, words) in split.iter().enumerate() {
        let shown = show(words);
        let statement = parse_statement(words)
            .map_err(|e| format!("statement {} ({shown}): {e}", index + 1))?;
        if let Some(Statement::Commit | Statement::Abort) = statements.last() {
            return Err(format!(
                "statement {} ({shown}): the transaction already ended at statement {index}",
                index + 1,
            ));
        }
        statements.push(statement);
    }
    Ok(statements)
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

/// The prefix of a word that looks like a typed form (`i64:`, `t3:`, `u8:`: letters, then
/// digits, then a colon), if it has one.
fn typed_prefix(word: &str) -> Option<&str> {
    let (prefix, _) = word.split_once(':')?;
    let letters = prefix.trim_end_matches(|c: char| c.is_ascii_digit());
    let typed = !letters.is_empty()
        && letters.len() < prefix.len()
        && letters.chars().all(|c| c.is_ascii_alphabetic());
    typed.then_some(prefix)
}

pub(super) fn parse_key(word: &Word) -> Result<Key, String> {
    let text = word.text.as_str();
    if word.quoted {
        if text.is_empty() {
            return Err("an empty key".into());
        }
        return Ok(text_key(text));
    }
    if let Some(hex) = text.strip_prefix("0x") {
        return Ok(Key::from(parse_hex(hex)?));
    }
    if let Some(prefix) = typed_prefix(text) {
        let table =
            prefix.strip_prefix('t').and_then(|t| t.parse::<u8>().ok()).ok_or_else(|| {
                format!(
                    "{text}: {prefix}: is no key form; accepted: text, 0xHEX, tT:N[:N...] with \
                     T in 0..=255 (put text in quotes: \"{text}\")"
                )
            })?;
        let parts = &text[prefix.len() + 1..];
        let mut key = Key::table(table);
        for part in parts.split(':') {
            let n = part
                .parse::<u64>()
                .map_err(|_| format!("{text}: {part:?} is not an unsigned integer"))?;
            key = key.u64(n);
        }
        return Ok(key.build());
    }
    if text.is_empty() {
        return Err("an empty key".into());
    }
    Ok(text_key(text))
}

pub(super) fn parse_value(word: &Word) -> Result<Value, String> {
    let text = word.text.as_str();
    if word.quoted {
        return Ok(text.as_bytes().to_vec());
    }
    if let Some(hex) = text.strip_prefix("0x") {
        return parse_hex(hex);
    }
    if let Some(n) = text.strip_prefix("i64:") {
        let n = n.parse::<i64>().map_err(|_| format!("{text}: not a signed integer"))?;
        return Ok(n.to_le_bytes().to_vec());
    }
    if let Some(prefix) = typed_prefix(text) {
        return Err(format!(
            "{text}: {prefix}: is no value type; accepted: text, 0xHEX, i64:N (put text in \
             quotes: \"{text}\")"
        ));
    }
    Ok(text.as_bytes().to_vec())
}

pub(super) fn parse_statement(words: &[Word]) -> Result<Statement, String> {
    let Some((verb, rest)) = words.split_first() else { return Err("empty".into()) };
    if verb.quoted {
        return Err(format!("{:?}: a statement starts with its verb, unquoted", verb.text));
    }
    let arity = |n: usize, usage: &str| {
        if rest.len() == n {
            Ok(())
        } else {
            Err(format!("usage: {usage}"))
        }
    };
    Ok(match verb.text.to_ascii_lowercase().as_str() {
        "get" => {
            if rest.is_empty() {
                return Err("usage: get KEY [KEY ...]".into());
            }
            Statement::Get(rest.iter().map(parse_key).collect::<Result<_, _>>()?)
        }
        "put" => {
            arity(2, "put KEY VALUE (quote a value with spaces: put k \"two words\")")?;
            Statement::Put(parse_key(&rest[0])?, parse_value(&rest[1])?)
        }
        "delete" => {
            arity(1, "delete KEY")?;
            Statement::Delete(parse_key(&rest[0])?)
        }
        "scan" => {
            let usage = "usage: scan START END [LIMIT] [reverse]";
            if !(2..=4).contains(&rest.len()) {
                return Err(usage.into());
            }
            let (start, end) = (parse_key(&rest[0])?, parse_key(&rest[1])?);
            if start > end {
                let (a, b) = (show(&rest[..1]), show(&rest[1..2]));
                return Err(format!("scan range reversed: {a} is after {b}"));
            }
            let mut limit = SCAN_LIMIT_DEFAULT;
            let mut reverse = false;
            for word in &rest[2..] {
                if word.text.eq_ignore_ascii_case("reverse") && !word.quoted {
                    reverse = true;
                } else {
                    limit = word
                        .text
                        .parse::<u32>()
                        .ok()
                        .filter(|&l| l > 0 && l <= meridian_core::txn::SCAN_ROWS_MAX)
                        .ok_or_else(|| {
                            format!("limit {}: give 1..=10000, or `reverse`", word.text)
                        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::TEXT_TABLE;

    fn bad(text: &str) -> String {
        parse_all(text).unwrap_err()
    }

    #[test]
    fn statements_parse_and_bad_ones_name_themselves() {
        let statements =
            parse_all("get a t3:7; put a i64:5\ndelete 0x00ff; scan a b 10 reverse; commit")
                .unwrap();
        assert_eq!(statements.len(), 5);
        assert_eq!(
            statements[0],
            Statement::Get(vec![Key::from(vec![TEXT_TABLE, b'a']), Key::table(3).u64(7).build()])
        );
        assert_eq!(statements[1], Statement::Put(text_key("a"), 5i64.to_le_bytes().to_vec()));
        assert_eq!(statements[2], Statement::Delete(Key::from(vec![0, 255])));
        assert!(matches!(statements[3], Statement::Scan { limit: 10, reverse: true, .. }));
        assert!(
            bad("get a; put a").starts_with("statement 2 (put a): usage"),
            "{}",
            bad("get a; put a")
        );
        assert!(bad("scan b a").contains("reversed"));
        assert!(bad("commit; get a").contains("already ended"));
        assert!(bad("frobnicate").contains("unknown statement"));
        assert!(bad("put a 0xabc").contains("odd number"));
        assert!(bad("get 0x€1").contains("not hex"), "a multi-byte character is not a digit");
        assert!(bad("get 0x+1+2").contains("not hex"));
        assert!(bad("scan a b 0").contains("limit"));
        assert!(bad("").contains("no statements"));
        assert!(bad(" ; ;\n# only a comment\n").contains("no statements"));
    }

    #[test]
    fn semicolons_lines_quotes_and_comments_split_alike_everywhere() {
        // `;` and line ends both end a statement; a quoted word keeps spaces, `;` and `#`.
        let text = "get alice; put alice \"hello; world # not a comment\"\n# a comment; get x\nput \"a b\" 1;commit";
        let statements = parse_all(text).unwrap();
        assert_eq!(statements.len(), 4, "{statements:?}");
        assert_eq!(statements[0], Statement::Get(vec![text_key("alice")]));
        assert_eq!(
            statements[1],
            Statement::Put(text_key("alice"), b"hello; world # not a comment".to_vec())
        );
        assert_eq!(statements[2], Statement::Put(text_key("a b"), b"1".to_vec()));
        assert_eq!(statements[3], Statement::Commit);
        // Escapes, and a quoted value that looks typed is text.
        let statements = parse_all(r#"put k "say \"hi\"\\\n"; put k "i64:5""#).unwrap();
        assert_eq!(statements[0], Statement::Put(text_key("k"), b"say \"hi\"\\\n".to_vec()));
        assert_eq!(statements[1], Statement::Put(text_key("k"), b"i64:5".to_vec()));
        assert!(bad("put k \"open").contains("statement 1: a quote that does not end"));
        assert!(bad("put k ab\"c\"").contains("a quote inside the word"));
        assert!(bad(r#"put k "\q""#).contains("unknown escape"));
        assert!(bad("\"get\" a").contains("unquoted"));
    }

    #[test]
    fn what_looks_typed_but_is_not_is_refused_with_a_hint() {
        for (text, says) in [
            ("put frank i46:5", "i46: is no value type"),
            ("put frank I64:5", "I64: is no value type"),
            ("put frank u8:1", "put text in quotes"),
            ("get t300:1", "t300: is no key form"),
            ("get x3:1", "put text in quotes: \"x3:1\""),
            ("put a i64:five", "not a signed integer"),
            ("get t3:seven", "is not an unsigned integer"),
        ] {
            assert!(bad(text).contains(says), "{text}: {}", bad(text));
        }
        // Text with a colon that is not typed stays text.
        let statements = parse_all("put url http://x:80/a; put a:b c:d").unwrap();
        assert_eq!(statements[0], Statement::Put(text_key("url"), b"http://x:80/a".to_vec()));
        assert_eq!(statements[1], Statement::Put(text_key("a:b"), b"c:d".to_vec()));
    }
}
