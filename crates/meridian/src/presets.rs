//! The experiment files under `experiments/` that reproduce the reference studies, built into
//! the binary so that `meridian bench --preset NAME` works from anywhere.

/// `(name, file text)` of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("luigi-micro", include_str!("../../../experiments/luigi-micro.toml")),
    ("luigi-tpcc", include_str!("../../../experiments/luigi-tpcc.toml")),
    ("luigi-cross-shard", include_str!("../../../experiments/luigi-cross-shard.toml")),
    ("tiga-micro", include_str!("../../../experiments/tiga-micro.toml")),
    ("tiga-tpcc", include_str!("../../../experiments/tiga-tpcc.toml")),
    ("single-node", include_str!("../../../experiments/single-node.toml")),
    ("crossstitch-latency", include_str!("../../../experiments/crossstitch-latency.toml")),
    ("crossstitch-3dc", include_str!("../../../experiments/crossstitch-3dc.toml")),
];

/// The text of preset `name`, or an error listing the presets.
pub fn preset(name: &str) -> Result<&'static str, String> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        format!("unknown preset '{name}'; presets: {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each preset runs every protocol that exists: a new protocol fails this until the
    /// presets name it.
    #[test]
    fn every_preset_runs_every_protocol() {
        for (name, text) in PRESETS {
            let table: toml::Table = text.parse().expect("presets parse");
            let listed: Vec<&str> = table["protocol"]
                .as_array()
                .expect("a list of protocols")
                .iter()
                .filter_map(|p| p.as_str())
                .collect();
            for protocol in meridian_protocols::PROTOCOLS {
                assert!(listed.contains(protocol), "preset {name} leaves out {protocol}");
            }
        }
    }
}
