//! A run as a results folder keeps it (`stats.json`), read back: what reports, comparisons
//! and the published-figures section ([`crate::reference`]) need of each run.

use crate::stats::Summary;
use serde::Deserialize;
use std::path::Path;

/// One check's verdict as `stats.json` holds it.
#[derive(Clone, Debug, Deserialize)]
pub struct SavedCheck {
    /// The invariant.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// What was found.
    #[serde(default)]
    pub detail: String,
}

/// What a report needs of one run's `stats.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct SavedRun {
    /// Every parameter of the run.
    pub parameters: serde_json::Value,
    /// Its figures.
    pub summary: Summary,
    /// Its checks.
    #[serde(default)]
    pub checks: Vec<SavedCheck>,
    /// Its first failure, if a request failed.
    #[serde(default)]
    pub first_failure: Option<String>,
}

impl SavedRun {
    /// Reads a `stats.json`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The run's name in tables and legends: the `label` parameter a comparison gives each
    /// run (`2pl-wound-wait`), else the protocol with its options (`occ occ-one-round=on`).
    pub fn label(&self) -> String {
        let p = &self.parameters;
        match p["label"].as_str() {
            Some(label) => label.to_string(),
            None => self.protocol_with_options(),
        }
    }

    /// `occ occ-one-round=on`: the protocol and every option setting it ran with.
    pub(crate) fn protocol_with_options(&self) -> String {
        let p = &self.parameters;
        let mut text = p["protocol"].as_str().unwrap_or("?").to_string();
        if let Some(options) = p["protocol_options"].as_object() {
            for (name, value) in options {
                text += &format!(" {name}={}", value.as_str().unwrap_or("?"));
            }
        }
        text
    }

    pub(crate) fn setup(&self) -> String {
        let p = &self.parameters;
        format!(
            "{} on {}x{} over `{}`, {} clients",
            p["workload"]["name"].as_str().unwrap_or("?"),
            p["shards"],
            p["replicas"],
            p["network"]["name"].as_str().unwrap_or("?"),
            p["clients"]
        )
    }

    /// What the run shares with the other points of its sweep line: every parameter but the
    /// client count and the network's name (and what names or records the run).
    pub(crate) fn group(&self) -> String {
        let mut p = self.parameters.clone();
        if let Some(map) = p.as_object_mut() {
            // `load` names the client count too (the load model itself stays in `outstanding`
            // and `rate_per_s`); `offered` counts what a run's own clients drew.
            for key in [
                "clients",
                "load",
                "offered",
                "label",
                "repetition",
                "provenance",
                "seed",
                "trace_hash",
                "virtual_s",
            ] {
                map.remove(key);
            }
            if let Some(network) = map.get_mut("network").and_then(|n| n.as_object_mut()) {
                network.remove("name");
                network.remove("owd_ms_max");
            }
        }
        p.to_string()
    }

    /// A short name for the sweep line: protocol, options, workload and layout.
    pub(crate) fn group_title(&self) -> String {
        let p = &self.parameters;
        format!(
            "{}, {} on {}x{}{}",
            self.protocol_with_options(),
            p["workload"]["name"].as_str().unwrap_or("?"),
            p["shards"],
            p["replicas"],
            p["durability"].as_str().map_or(String::new(), |d| format!(", {d}"))
        )
    }

    pub(crate) fn clients(&self) -> u64 {
        self.parameters["clients"].as_u64().unwrap_or(0)
    }

    pub(crate) fn network(&self) -> String {
        self.parameters["network"]["name"].as_str().unwrap_or("?").to_string()
    }

    pub(crate) fn checks_verdict(&self) -> String {
        let failed: Vec<&str> =
            self.checks.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        match (self.checks.len(), failed.is_empty()) {
            (0, _) => "none ran".into(),
            (n, true) => format!("{n} passed"),
            (_, false) => format!("FAILED: {}", failed.join(", ")),
        }
    }
}
