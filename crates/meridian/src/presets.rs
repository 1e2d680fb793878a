//! The experiment files under `experiments/` that reproduce the reference studies, built into
//! the binary so that `meridian bench --preset NAME` works from anywhere.

/// `(name, file text)` of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("luigi-micro", include_str!("../../../experiments/luigi-micro.toml")),
    ("luigi-tpcc", include_str!("../../../experiments/luigi-tpcc.toml")),
    ("luigi-cross-shard", include_str!("../../../experiments/luigi-cross-shard.toml")),
    ("tiga-micro", include_str!("../../../experiments/tiga-micro.toml")),
    ("single-node", include_str!("../../../experiments/single-node.toml")),
];

/// The text of preset `name`, or an error listing the presets.
pub fn preset(name: &str) -> Result<&'static str, String> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        format!("unknown preset '{name}'; presets: {}", names.join(", "))
    })
}
