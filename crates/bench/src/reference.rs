//! Published figures beside ours. A reference file (`<experiment>.reference.toml` beside an
//! experiment file; built in for the presets) names its source and lists cells, each the
//! parameters of one run of the experiment's grid and the figures the reference published
//! for it:
//!
//! ```toml
//! source = "Luigi README, 2-shard 3-replica microbenchmark table"
//! [[cell]]
//! protocol = "luigi"
//! shards = 2
//! replicas = 3
//! network = "metro"
//! clients = 1
//! throughput_txn_per_s = 6684
//! ```
//!
//! A cell's parameters are experiment-file keys ([`CELL_KEYS`]); its figures are
//! [`FIGURE_KEYS`], at least one. [`Reference::check_grid`] refuses a file with a cell that no
//! run of the grid matches, naming the cell. The report ([`section`]) puts, per cell, the
//! published figure, ours and their ratio, and judges the *shape*: which protocol wins each
//! setting the cells give for several protocols, and for each line of cells that differ only
//! in their client count, the throughput ratio from the fewest clients to the most, published
//! against ours.

use crate::saved::SavedRun;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Most cells one reference file holds.
pub const REFERENCE_CELLS_MAX: usize = 2_000;
/// Keys that name a cell's run (experiment-file keys, as in `stats.json`'s parameters).
pub const CELL_KEYS: &[&str] =
    &["protocol", "shards", "replicas", "network", "clients", "remote_item_pct", "tpcc_mode"];
/// Figures a cell may give.
pub const FIGURE_KEYS: &[&str] = &["throughput_txn_per_s", "latency_ms_p50", "latency_ms_mean"];
/// A thread-scaling ratio within this fraction of the published one holds the shape.
pub const SCALING_TOLERANCE: f64 = 0.3;

/// One published cell.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// Its run's parameters, `key -> value` as text.
    pub run: BTreeMap<String, String>,
    /// The published figures, by [`FIGURE_KEYS`] name.
    pub figures: BTreeMap<String, f64>,
}

impl Cell {
    /// `protocol=luigi shards=2 ...`, for messages and tables.
    pub fn name(&self) -> String {
        self.run.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }

    /// True when `flags` (a run's `bench` flags, `--key value`) give every parameter of the
    /// cell (parameters the flags do not name do not match).
    pub fn matches_flags(&self, flags: &[String]) -> bool {
        self.run.iter().all(|(key, value)| {
            let flag = format!("--{}", key.replace('_', "-"));
            flags.windows(2).any(|w| w[0] == flag && w[1] == *value)
        })
    }

    /// True when `run` (read back from its `stats.json`) is this cell's run.
    pub fn matches_run(&self, run: &SavedRun) -> bool {
        self.run.iter().all(|(key, value)| parameter(run, key).is_some_and(|v| v == *value))
    }
}

/// A run's parameter `key` as text, from its `stats.json`.
fn parameter(run: &SavedRun, key: &str) -> Option<String> {
    let p = &run.parameters;
    let value = match key {
        "network" => &p["network"]["name"],
        "remote_item_pct" => &p["workload"]["remote_item_percent"],
        "tpcc_mode" => &p["workload"]["mode"],
        other => &p[other],
    };
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A parsed reference file.
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    /// The document, and the table or figure, the cells come from.
    pub source: String,
    /// The cells.
    pub cells: Vec<Cell>,
}

impl Reference {
    /// Parses a reference file's text (`file` names it in errors).
    pub fn parse(text: &str, file: &str) -> Result<Self, String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            format!("{file}: {}", e.to_string().trim().replace('\n', " "))
        })?;
        for key in table.keys() {
            if key != "source" && key != "cell" {
                return Err(format!("{file}: unknown key '{key}'; accepted: source, cell"));
            }
        }
        let source = match table.get("source") {
            Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => return Err(format!("{file}: 'source' must name the document and its table")),
        };
        let Some(toml::Value::Array(raw)) = table.get("cell") else {
            return Err(format!("{file}: no [[cell]] tables"));
        };
        if raw.len() > REFERENCE_CELLS_MAX {
            return Err(format!("{file}: {} cells; at most {REFERENCE_CELLS_MAX}", raw.len()));
        }
        let mut cells = Vec::with_capacity(raw.len());
        for (index, cell) in raw.iter().enumerate() {
            let at = format!("{file}: cell {}", index + 1);
            let toml::Value::Table(cell) = cell else {
                return Err(format!("{at}: must be a [[cell]] table"));
            };
            let (mut run, mut figures) = (BTreeMap::new(), BTreeMap::new());
            for (key, value) in cell {
                if CELL_KEYS.contains(&key.as_str()) {
                    let text = match value {
                        toml::Value::String(s) => s.clone(),
                        toml::Value::Integer(i) => i.to_string(),
                        other => {
                            return Err(format!(
                                "{at}: '{key}' must be a string or a whole number, got {other}"
                            ))
                        }
                    };
                    run.insert(key.clone(), text);
                } else if FIGURE_KEYS.contains(&key.as_str()) {
                    let number = match value {
                        toml::Value::Integer(i) => *i as f64,
                        toml::Value::Float(f) => *f,
                        other => {
                            return Err(format!("{at}: '{key}' must be a number, got {other}"))
                        }
                    };
                    if !(number.is_finite() && number > 0.0) {
                        return Err(format!("{at}: '{key}' must be above 0, got {number}"));
                    }
                    figures.insert(key.clone(), number);
                } else {
                    let accepted: Vec<&str> =
                        CELL_KEYS.iter().chain(FIGURE_KEYS).copied().collect();
                    return Err(format!(
                        "{at}: unknown key '{key}'; accepted: {}",
                        accepted.join(", ")
                    ));
                }
            }
            if run.is_empty() || figures.is_empty() {
                return Err(format!("{at}: a cell names its run and at least one figure"));
            }
            let cell = Cell { run, figures };
            if cells.iter().any(|c: &Cell| c.run == cell.run) {
                return Err(format!("{at}: '{}' is given twice", cell.name()));
            }
            cells.push(cell);
        }
        Ok(Self { source, cells })
    }

    /// Refuses a reference whose cells do not all fall on the grid `runs` (each run's `bench`
    /// flags), naming the first cell that does not.
    pub fn check_grid(&self, runs: &[Vec<String>]) -> Result<(), String> {
        match self.cells.iter().find(|c| !runs.iter().any(|flags| c.matches_flags(flags))) {
            Some(cell) => Err(format!(
                "reference cell '{}' matches no run of the experiment's grid",
                cell.name()
            )),
            None => Ok(()),
        }
    }
}

/// Our figure named `key` of `run`.
fn ours(run: &SavedRun, key: &str) -> Option<f64> {
    let s = &run.summary;
    match key {
        "throughput_txn_per_s" => Some(s.throughput_txn_per_s),
        "latency_ms_p50" => Some(s.latency_ms_p50),
        "latency_ms_mean" => Some(s.latency_ms_mean),
        _ => None,
    }
}

/// The report's section comparing `reference` with `runs`: per cell the published figure,
/// ours and the ratio (ours / published), cells not run (a `--quick` grid) counted; then the
/// thread-scaling verdicts.
pub fn section(reference: &Reference, runs: &[SavedRun]) -> String {
    let mut md = format!("## Published figures\n\nSource: {}.\n\n", reference.source);
    let _ = writeln!(md, "| cell | figure | published | ours | ours / published |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    let mut missing = 0;
    for cell in &reference.cells {
        let Some(run) = runs.iter().find(|r| cell.matches_run(r)) else {
            missing += 1;
            continue;
        };
        for (key, published) in &cell.figures {
            let Some(value) = ours(run, key) else { continue };
            let _ = writeln!(
                md,
                "| {} | {key} | {published:.1} | {value:.1} | {:.2} |",
                cell.name(),
                value / published
            );
        }
    }
    if missing > 0 {
        let _ = writeln!(md, "\n{missing} published cells were not among these runs.");
    }
    let winners = ordering_verdicts(reference, runs);
    if !winners.is_empty() {
        let _ = writeln!(
            md,
            "\n**Who wins**: per setting that the published cells give for several protocols \
             (a protocol's `tpcc_mode` aside), the protocol with the highest throughput, \
             published and ours.\n"
        );
        let _ = writeln!(md, "| setting | published winner | ours | shape |");
        let _ = writeln!(md, "|---|---|---|---|");
        md += &winners;
    }
    let verdicts = scaling_verdicts(reference, runs);
    if !verdicts.is_empty() {
        let _ = writeln!(
            md,
            "\n**Thread scaling**: throughput at the most clients over the fewest, per line of \
             cells that differ only in clients; the shape holds when ours is within ±{:.0}% of \
             the published ratio.\n",
            SCALING_TOLERANCE * 100.0
        );
        let _ = writeln!(md, "| line | clients | published ratio | ours | shape |");
        let _ = writeln!(md, "|---|---|---|---|---|");
        md += &verdicts;
    }
    md.push('\n');
    md
}

/// One table row per setting (a cell's run without `protocol` and `tpcc_mode`) for which
/// throughput cells of two or more protocols ran: the published winner against ours.
fn ordering_verdicts(reference: &Reference, runs: &[SavedRun]) -> String {
    // setting -> [(protocol, published, ours)]
    let mut settings: BTreeMap<String, Vec<(String, f64, f64)>> = BTreeMap::new();
    for cell in &reference.cells {
        let (Some(protocol), Some(&published)) =
            (cell.run.get("protocol"), cell.figures.get("throughput_txn_per_s"))
        else {
            continue;
        };
        let Some(run) = runs.iter().find(|r| cell.matches_run(r)) else { continue };
        let setting: Vec<String> = cell
            .run
            .iter()
            .filter(|(k, _)| *k != "protocol" && *k != "tpcc_mode")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let entry = (protocol.clone(), published, run.summary.throughput_txn_per_s);
        settings.entry(setting.join(" ")).or_default().push(entry);
    }
    let mut md = String::new();
    for (setting, entries) in settings {
        let protocols: std::collections::BTreeSet<&String> = entries.iter().map(|e| &e.0).collect();
        if protocols.len() < 2 {
            continue;
        }
        let best = |pick: fn(&(String, f64, f64)) -> f64| {
            entries.iter().max_by(|a, b| pick(a).total_cmp(&pick(b))).map(|e| e.0.clone())
        };
        let (published, ours) = (best(|e| e.1), best(|e| e.2));
        let holds = if published == ours { "holds" } else { "differs" };
        let (published, ours) = (published.unwrap_or_default(), ours.unwrap_or_default());
        let _ = writeln!(md, "| {setting} | {published} | {ours} | {holds} |");
    }
    md
}

/// One table row per line of throughput cells that differ only in their client count and
/// whose two ends both ran.
fn scaling_verdicts(reference: &Reference, runs: &[SavedRun]) -> String {
    let mut lines: BTreeMap<String, Vec<(u64, f64, f64)>> = BTreeMap::new();
    for cell in &reference.cells {
        let (Some(clients), Some(&published)) =
            (cell.run.get("clients"), cell.figures.get("throughput_txn_per_s"))
        else {
            continue;
        };
        let Ok(clients) = clients.parse::<u64>() else { continue };
        let Some(run) = runs.iter().find(|r| cell.matches_run(r)) else { continue };
        let mut rest = cell.run.clone();
        rest.remove("clients");
        let line = rest.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        lines.entry(line).or_default().push((clients, published, run.summary.throughput_txn_per_s));
    }
    let mut md = String::new();
    for (line, mut points) in lines {
        if points.len() < 2 {
            continue;
        }
        points.sort_by_key(|p| p.0);
        let (first, last) = (points[0], points[points.len() - 1]);
        if first.2 <= 0.0 {
            continue;
        }
        let published = last.1 / first.1;
        let measured = last.2 / first.2;
        let holds = (measured / published - 1.0).abs() <= SCALING_TOLERANCE;
        let _ = writeln!(
            md,
            "| {line} | {} → {} | {published:.2} | {measured:.2} | {} |",
            first.0,
            last.0,
            if holds { "holds" } else { "differs" }
        );
    }
    md
}

#[cfg(test)]
mod tests;
