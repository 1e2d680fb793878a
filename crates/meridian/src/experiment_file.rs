//! Experiment files: `meridian bench --experiment FILE.toml`.
//!
//! Every key is a `bench` flag, spelled with underscores (`keys_per_shard = 1000` is
//! `--keys-per-shard 1000`; `quiet = true` is `--quiet`), and any value may be a list: the runs
//! are the Cartesian product of the lists. `[[points]]` tables list explicit points instead
//! (each may also hold lists); the file's other keys apply to every point. `protocol_option`
//! takes settings `"name=value"` (several in one string separated by commas); a setting whose
//! option belongs to another protocol is left out of that protocol's runs, and runs that end up
//! the same are run once. `fault` takes a fault line or a list of them: the list is one
//! schedule (`--fault` per line), not a dimension. A `[quick]` table holds keys that replace the file's own under
//! `--quick` (a short version of the study). `repetitions = N` runs every point N times with
//! seeds `seed`, `seed + 1`, ... (reports show the median and the spread). Flags given on the command line override the
//! file's keys. A file
//! with an unknown key, a value of the wrong type or an empty list is refused before anything
//! runs, with the file, line and key named.

use std::collections::{BTreeMap, BTreeSet};
use toml::Value;

/// Most runs one file may describe (repetitions included).
pub const POINTS_MAX: usize = 10_000;
/// Most repetitions of one point.
pub const REPETITIONS_MAX: u64 = 100;

/// How a key becomes flags.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `--key VALUE`.
    Value,
    /// `--key` when true.
    Flag,
    /// `--protocol-option NAME=VALUE` for each setting of a comma-separated string.
    Options,
    /// `--fault LINE` for each line of a list: the whole list is one value (a schedule), not
    /// a dimension to sweep.
    Schedule,
}

/// The keys a file may hold.
const KEYS: &[(&str, Kind)] = &[
    ("protocol", Kind::Value),
    ("protocol_option", Kind::Options),
    ("fault", Kind::Schedule),
    ("workload", Kind::Value),
    ("shards", Kind::Value),
    ("replicas", Kind::Value),
    ("regions", Kind::Value),
    ("network", Kind::Value),
    ("clock", Kind::Value),
    ("clients", Kind::Value),
    ("load", Kind::Value),
    ("rate", Kind::Value),
    ("outstanding", Kind::Value),
    ("server_regions", Kind::Value),
    ("client_regions", Kind::Value),
    ("replica_placement", Kind::Value),
    ("keys_per_shard", Kind::Value),
    ("zipf", Kind::Value),
    ("ops_max", Kind::Value),
    ("distribution", Kind::Value),
    ("region_groups", Kind::Value),
    ("warehouses_per_shard", Kind::Value),
    ("remote_item_pct", Kind::Value),
    ("remote_payment_pct", Kind::Value),
    ("tpcc_mode", Kind::Value),
    ("tpcc_scale", Kind::Value),
    ("seed", Kind::Value),
    ("duration", Kind::Value),
    ("warmup", Kind::Value),
    ("durability", Kind::Value),
    ("snapshot_interval", Kind::Value),
    ("log_store", Kind::Value),
    ("pg_url", Kind::Value),
    ("pg_isolation", Kind::Value),
    ("quiet", Kind::Flag),
];

/// One run of the experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The keys that vary between runs, `key=value` (the whole point when nothing varies).
    pub label: String,
    /// Its `bench` flags, without those the command line gives.
    pub args: Vec<String>,
}

/// An experiment: its name and runs.
#[derive(Debug)]
pub struct ExperimentFile {
    /// `name`, or the file's stem.
    pub name: String,
    /// The runs, in order.
    pub points: Vec<Point>,
    /// How many times each point runs.
    pub repetitions: u64,
}

/// The line of the first `key = ...` at or after line `from` (1-based), for error messages.
fn line_of(text: &str, key: &str, from: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find(|(_, line)| {
            let line = line.trim_start();
            line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(from.max(1), |(i, _)| i + 1)
}

/// The line of the first line reading exactly `header` at or after line `from` (1-based).
fn header_line(text: &str, header: &str, from: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find(|(_, line)| line.trim() == header)
        .map_or(from.max(1), |(i, _)| i + 1)
}

/// A scalar as the flag's value.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Integer(i) => Some(i.to_string()),
        Value::Float(f) => Some(f.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The values one key takes: a scalar, or each element of a non-empty list of scalars.
fn values_of(
    key: &str,
    value: &Value,
    kind: Kind,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<Value>, String> {
    if kind == Kind::Schedule {
        let lines = match value {
            Value::Array(items) => items.as_slice(),
            single => std::slice::from_ref(single),
        };
        if lines.is_empty() || !lines.iter().all(|l| matches!(l, Value::String(_))) {
            return Err(format!(
                "{}: '{key}' must be a fault line or a non-empty list of them, got {value}",
                at(key)
            ));
        }
        return Ok(vec![Value::Array(lines.to_vec())]);
    }
    let items = match value {
        Value::Array(items) if items.is_empty() => {
            return Err(format!("{}: '{key}' is an empty list: nothing to run", at(key)))
        }
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    for item in &items {
        let fits = match kind {
            Kind::Flag => matches!(item, Value::Boolean(_)),
            Kind::Options => matches!(item, Value::String(_)),
            Kind::Schedule => true,
            Kind::Value => scalar(item).is_some() && !matches!(item, Value::Boolean(_)),
        };
        if !fits {
            let expected = match kind {
                Kind::Flag => "true or false",
                Kind::Options => "a string \"name=value\" (or a list of them)",
                Kind::Schedule => "fault lines",
                Kind::Value => "a string or a number (or a list of them)",
            };
            return Err(format!("{}: '{key}' must be {expected}, got {item}", at(key)));
        }
    }
    Ok(items)
}

/// Key-by-key value lists of one table (the file's top level or one point).
fn dimensions(
    table: &toml::Table,
    at: &dyn Fn(&str) -> String,
) -> Result<BTreeMap<String, Vec<Value>>, String> {
    let mut dims = BTreeMap::new();
    for (key, value) in table {
        if ["name", "points", "quick", "repetitions"].contains(&key.as_str()) {
            continue;
        }
        let Some(&(_, kind)) = KEYS.iter().find(|(k, _)| k == key) else {
            let accepted: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "{}: unknown key '{key}'; accepted: name, points, quick, repetitions, {}",
                at(key),
                accepted.join(", ")
            ));
        };
        dims.insert(key.clone(), values_of(key, value, kind, at)?);
    }
    Ok(dims)
}

/// Parses an experiment file's text. `given` holds the keys the command line sets (those of
/// the file are left out of every run).
pub fn parse(
    text: &str,
    file: &str,
    given: &BTreeSet<String>,
    quick: bool,
    cli_protocol: Option<&str>,
) -> Result<ExperimentFile, String> {
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        format!("{file}: {}", e.to_string().trim().replace('\n', " "))
    })?;
    match table.remove("quick") {
        None if quick => {
            return Err(format!("{file}: --quick needs a [quick] table; this file has none"))
        }
        None => {}
        Some(toml::Value::Table(shorter)) => {
            let from = header_line(text, "[quick]", 1);
            let at = |key: &str| format!("{file}:{}", line_of(text, key, from));
            dimensions(&shorter, &at)?;
            if quick {
                table.extend(shorter);
            }
        }
        Some(_) => {
            return Err(format!("{file}:{}: 'quick' must be a table", line_of(text, "quick", 1)))
        }
    }
    let top_at = |key: &str| format!("{file}:{}", line_of(text, key, 1));
    let name = match table.get("name") {
        None => std::path::Path::new(file)
            .file_stem()
            .map_or("experiment".into(), |s| s.to_string_lossy().into_owned()),
        Some(Value::String(name)) if !name.is_empty() && name.len() <= 64 => name.clone(),
        Some(other) => {
            return Err(format!(
                "{}: 'name' must be a string of 1 to 64 characters, got {other}",
                top_at("name")
            ))
        }
    };
    let repetitions = match table.get("repetitions") {
        None => 1,
        Some(Value::Integer(n)) if (1..=REPETITIONS_MAX as i64).contains(n) => *n as u64,
        Some(other) => {
            return Err(format!(
                "{}: 'repetitions' must be a whole number in 1..={REPETITIONS_MAX}, got {other}",
                top_at("repetitions")
            ))
        }
    };
    let base = dimensions(&table, &top_at)?;
    let points: Vec<BTreeMap<String, Vec<Value>>> = match table.get("points") {
        None => vec![BTreeMap::new()],
        Some(Value::Array(points)) if !points.is_empty() => {
            let mut tables = Vec::with_capacity(points.len());
            let mut from = 1;
            for point in points {
                let Value::Table(point) = point else {
                    return Err(format!(
                        "{}: 'points' must be [[points]] tables",
                        top_at("points")
                    ));
                };
                from = header_line(text, "[[points]]", from) + 1;
                let start = from;
                let at = |key: &str| format!("{file}:{}", line_of(text, key, start));
                tables.push(dimensions(point, &at)?);
            }
            tables
        }
        Some(_) => {
            return Err(format!(
                "{}: 'points' must be a non-empty list of [[points]] tables",
                top_at("points")
            ))
        }
    };
    let mut runs: Vec<Point> = Vec::new();
    let mut seen = BTreeSet::new();
    for point in &points {
        let mut dims = base.clone();
        for (key, values) in point {
            dims.insert(key.clone(), values.clone());
        }
        dims.retain(|key, _| !given.contains(key));
        let varying: BTreeSet<String> = dims
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, _)| k.clone())
            .chain(point.keys().cloned())
            .collect();
        let total: usize = dims
            .values()
            .map(Vec::len)
            .try_fold(1usize, |acc, n| acc.checked_mul(n))
            .unwrap_or(usize::MAX);
        if total.saturating_add(runs.len()).saturating_mul(repetitions as usize) > POINTS_MAX {
            return Err(format!("{file}: the sweep has more than {POINTS_MAX} runs"));
        }
        for index in 0..total {
            let mut rest = index;
            let mut chosen: Vec<(&str, &Value)> = Vec::with_capacity(dims.len());
            for (key, values) in &dims {
                chosen.push((key, &values[rest % values.len()]));
                rest /= values.len();
            }
            let run = point_of(&chosen, &varying, cli_protocol);
            if seen.insert(run.args.clone()) {
                runs.push(run);
            }
        }
    }
    Ok(ExperimentFile { name, points: runs, repetitions })
}

/// The flags and label of one combination.
fn point_of(
    chosen: &[(&str, &Value)],
    varying: &BTreeSet<String>,
    cli_protocol: Option<&str>,
) -> Point {
    // The command line's --protocol, when given, is every run's.
    let protocol = cli_protocol.map(str::to_string).unwrap_or_else(|| {
        chosen
            .iter()
            .find(|(k, _)| *k == "protocol")
            .and_then(|(_, v)| scalar(v))
            .unwrap_or_else(|| "occ".into())
    });
    let mut args = Vec::new();
    let mut label = Vec::new();
    for &(key, value) in chosen {
        let flag = format!("--{}", key.replace('_', "-"));
        let kind = KEYS.iter().find(|(k, _)| *k == key).map_or(Kind::Value, |(_, kind)| *kind);
        let text = scalar(value).unwrap_or_default();
        match kind {
            Kind::Flag if text == "true" => args.push(flag),
            Kind::Flag => {}
            Kind::Options => {
                // Settings of another protocol's options do not apply to this run.
                let own: Vec<&str> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|s| s.starts_with(&format!("{protocol}-")))
                    .collect();
                for setting in &own {
                    args.extend([flag.clone(), setting.to_string()]);
                }
                if varying.contains(key) && !own.is_empty() {
                    label.push(own.join(","));
                }
                continue;
            }
            Kind::Schedule => {
                let lines: Vec<String> = match value {
                    Value::Array(items) => items.iter().filter_map(scalar).collect(),
                    single => scalar(single).into_iter().collect(),
                };
                for line in &lines {
                    args.extend([flag.clone(), line.clone()]);
                }
                if varying.contains(key) {
                    label.push(format!("faults={}", lines.join("; ")));
                }
                continue;
            }
            Kind::Value => args.extend([flag, text.clone()]),
        }
        if varying.contains(key) {
            label.push(format!("{key}={text}"));
        }
    }
    let label = if label.is_empty() { protocol } else { label.join(" ") };
    Point { label, args }
}

/// The keys the command-line flags `args` set (`--keys-per-shard` is `keys_per_shard`).
pub fn keys_given(args: &[String]) -> BTreeSet<String> {
    args.iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|flag| flag.split('=').next().unwrap_or(flag).replace('-', "_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> ExperimentFile {
        parse(text, "x.toml", &BTreeSet::new(), false, None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> String {
        parse(text, "x.toml", &BTreeSet::new(), false, None).expect_err("refused")
    }

    #[test]
    fn lists_multiply_and_only_varying_keys_name_the_runs() {
        let file = parse_ok(
            "workload = \"bank\"\nprotocol = [\"occ\", \"2pl\"]\nclients = [1, 2, 4]\nduration = 3\n",
        );
        assert_eq!(file.name, "x");
        assert_eq!(file.points.len(), 6);
        let labels: BTreeSet<&str> = file.points.iter().map(|p| p.label.as_str()).collect();
        assert!(labels.contains("clients=4 protocol=2pl"), "{labels:?}");
        let first = &file.points[0];
        assert!(first.args.windows(2).any(|w| w == ["--workload", "bank"]), "{:?}", first.args);
        assert!(first.args.windows(2).any(|w| w == ["--duration", "3"]));
    }

    #[test]
    fn options_of_another_protocol_are_left_out_and_duplicates_run_once() {
        let file = parse_ok(
            "protocol = [\"occ\", \"2pl\"]\nprotocol_option = [\"2pl-policy=no-wait\", \"2pl-policy=wound-wait\"]\n",
        );
        let labels: Vec<&str> = file.points.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(file.points.len(), 3, "{labels:?}");
        assert!(
            file.points.iter().filter(|p| p.args.contains(&"--protocol-option".into())).count()
                == 2
        );
        assert!(labels.contains(&"protocol=2pl 2pl-policy=wound-wait"), "{labels:?}");
    }

    #[test]
    fn explicit_points_take_the_other_keys_of_the_file() {
        let file = parse_ok(
            "name = \"two\"\nworkload = \"ycsb-a\"\n\n[[points]]\nprotocol = \"occ\"\nclients = 8\n\n[[points]]\nprotocol = \"2pl\"\nclients = [1, 2]\n",
        );
        assert_eq!(file.name, "two");
        assert_eq!(file.points.len(), 3);
        assert!(file.points.iter().all(|p| p.args.contains(&"ycsb-a".to_string())));
    }

    #[test]
    fn an_open_loop_sweeps_its_rate() {
        let text = "load = \"open\"\nrate = [100, 400]\nclients = 64\n";
        let file = parse(text, "x.toml", &BTreeSet::new(), false, None).unwrap();
        assert_eq!(file.points.len(), 2);
        for (point, rate) in file.points.iter().zip(["100", "400"]) {
            let args = point.args.join(" ");
            assert!(
                args.contains("--load open") && args.contains(&format!("--rate {rate}")),
                "{args}"
            );
        }
    }

    #[test]
    fn flags_on_the_command_line_override_the_file() {
        let given = keys_given(&["--clients".into(), "16".into(), "--quiet".into()]);
        let file = parse("clients = [1, 2, 4]\nseed = 3\n", "x.toml", &given, false, None).unwrap();
        assert_eq!(file.points.len(), 1, "the sweep over clients is the command line's now");
        assert!(!file.points[0].args.contains(&"--clients".to_string()));
    }

    #[test]
    fn a_protocol_on_the_command_line_keeps_its_own_option_settings() {
        let text = "protocol = [\"occ\", \"2pl\"]\nprotocol_option = [\"2pl-policy=no-wait\", \"2pl-policy=wound-wait\"]\n";
        let given = keys_given(&["--protocol".into(), "2pl".into()]);
        let file = parse(text, "x.toml", &given, false, Some("2pl")).unwrap();
        assert_eq!(file.points.len(), 2, "both policies of the command line's protocol");
        assert!(file.points.iter().all(|p| p.args.contains(&"--protocol-option".to_string())));
    }

    #[test]
    fn quick_replaces_keys_with_those_of_the_quick_table() {
        let text =
            "clients = [1, 2, 4, 8]\nduration = 30\n\n[quick]\nclients = [1, 8]\nduration = 1\n";
        assert_eq!(parse_ok(text).points.len(), 4);
        let quick = parse(text, "x.toml", &BTreeSet::new(), true, None).unwrap();
        assert_eq!(quick.points.len(), 2);
        assert!(quick.points[0].args.windows(2).any(|w| w == ["--duration", "1"]));
        assert!(parse("clients = 1\n", "x.toml", &BTreeSet::new(), true, None)
            .unwrap_err()
            .contains("[quick]"));
        let e = parse_err("clients = 1\n[quick]\nclients = 2\nbogus = 3\n");
        assert!(e.starts_with("x.toml:4: unknown key 'bogus'"), "{e}");
    }

    #[test]
    fn every_preset_parses_in_both_versions() {
        for (name, text) in crate::presets::PRESETS {
            for quick in [false, true] {
                let file = parse(text, name, &BTreeSet::new(), quick, None)
                    .unwrap_or_else(|e| panic!("{name} quick={quick}: {e}"));
                assert!(!file.points.is_empty(), "{name}");
            }
        }
    }

    #[test]
    fn repetitions_are_counted_and_bounded() {
        let file = parse_ok("repetitions = 3\nclients = [1, 2]\n");
        assert_eq!((file.points.len(), file.repetitions), (2, 3));
        assert_eq!(parse_ok("clients = 1\n").repetitions, 1);
        let e = parse_err("clients = 1\nrepetitions = 0\n");
        assert!(e.starts_with("x.toml:2: 'repetitions' must be a whole number in 1..=100"), "{e}");
        let e = parse_err("repetitions = 100\nclients = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nseed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\n");
        assert!(e.contains("more than 10000 runs"), "{e}");
    }

    #[test]
    fn bad_files_name_the_file_line_and_key() {
        let e = parse_err("workload = \"bank\"\nclinets = 4\n");
        assert!(e.starts_with("x.toml:2: unknown key 'clinets'"), "{e}");
        let e = parse_err("shards = [1, 2]\nclients = []\n");
        assert!(e.starts_with("x.toml:2: 'clients' is an empty list"), "{e}");
        let e = parse_err("\n\nshards = { a = 1 }\n");
        assert!(e.starts_with("x.toml:3: 'shards' must be a string or a number"), "{e}");
        let e = parse_err("quiet = \"yes\"\n");
        assert!(e.contains("'quiet' must be true or false"), "{e}");
        let e = parse_err("[[points]]\nprotocol = \"occ\"\n[[points]]\nbogus = 1\n");
        assert!(e.starts_with("x.toml:4: unknown key 'bogus'"), "{e}");
        let e = parse_err("[[points]]\nclients = 1\n[[points]]\nclients = []\n");
        assert!(e.starts_with("x.toml:4: 'clients' is an empty list"), "{e}");
        let e = parse_err("clients = [1, 2\n");
        assert!(e.starts_with("x.toml: TOML parse error at line 1"), "{e}");
        let e = parse_err("clients = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nseed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nshards = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nreplicas = [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]\nwarmup = [1, 2]\n");
        assert!(e.contains("more than 10000 runs"), "{e}");
    }
}
