//! The experiment files under `experiments/` that reproduce the reference studies, built into
//! the binary so that `meridian bench --preset NAME` works from anywhere.

/// `(name, file text)` of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("luigi-micro", include_str!("../../../experiments/luigi-micro.toml")),
    ("luigi-tpcc", include_str!("../../../experiments/luigi-tpcc.toml")),
    ("luigi-cross-shard", include_str!("../../../experiments/luigi-cross-shard.toml")),
    ("tiga-micro", include_str!("../../../experiments/tiga-micro.toml")),
    ("tiga-tpcc", include_str!("../../../experiments/tiga-tpcc.toml")),
    ("tpcc-new-order", include_str!("../../../experiments/tpcc-new-order.toml")),
    ("single-node", include_str!("../../../experiments/single-node.toml")),
    ("crossstitch-latency", include_str!("../../../experiments/crossstitch-latency.toml")),
    ("crossstitch-3dc", include_str!("../../../experiments/crossstitch-3dc.toml")),
    ("failover", include_str!("../../../experiments/failover.toml")),
];

/// `(preset, reference file text)`: the published figures a preset's report puts beside
/// its own (`meridian_bench::reference`).
pub const REFERENCES: &[(&str, &str)] = &[
    ("luigi-micro", include_str!("../../../experiments/luigi-micro.reference.toml")),
    ("luigi-cross-shard", include_str!("../../../experiments/luigi-cross-shard.reference.toml")),
];

/// The reference file of preset `name`, if it has one.
pub fn reference(name: &str) -> Option<&'static str> {
    REFERENCES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

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

    /// Every built-in reference file parses and each of its cells is a run of its preset's
    /// full grid.
    #[test]
    fn every_reference_falls_on_its_presets_grid() {
        for (name, text) in REFERENCES {
            let reference =
                meridian_bench::reference::Reference::parse(text, name).expect("parses");
            let file = crate::experiment_file::parse(
                preset(name).unwrap(),
                name,
                &Default::default(),
                false,
                None,
            )
            .unwrap();
            let grid: Vec<Vec<String>> = file.points.iter().map(|p| p.args.clone()).collect();
            reference.check_grid(&grid).unwrap();
        }
    }

    /// Each preset runs every protocol that exists and can run its workloads on each of its
    /// replica counts: a new protocol fails this until the presets name it, and one a preset
    /// leaves out must be unable to run one of the preset's workloads or replica counts.
    #[test]
    fn every_preset_runs_every_protocol_that_can_run_its_workloads() {
        for (name, text) in PRESETS {
            let table: toml::Table = text.parse().expect("presets parse");
            let listed: Vec<&str> = table["protocol"]
                .as_array()
                .expect("a list of protocols")
                .iter()
                .filter_map(|p| p.as_str())
                .collect();
            let mut workloads: Vec<&str> =
                table.get("workload").and_then(|w| w.as_str()).into_iter().collect();
            if let Some(points) = table.get("points").and_then(|p| p.as_array()) {
                workloads.extend(points.iter().filter_map(|p| p.get("workload")?.as_str()));
            }
            assert!(!workloads.is_empty(), "preset {name} names a workload");
            let mut tpcc = meridian_workloads::tpcc::TpccOptions::default();
            if let Some(mode) = table.get("tpcc_mode").and_then(|m| m.as_str()) {
                tpcc.mode =
                    meridian_workloads::tpcc::TpccOptions::parse_mode(mode).expect("a mode");
            }
            let replicas: Vec<u32> = match table.get("replicas") {
                Some(toml::Value::Integer(r)) => vec![*r as u32],
                Some(toml::Value::Array(list)) => {
                    list.iter().filter_map(|r| r.as_integer()).map(|r| r as u32).collect()
                }
                _ => vec![1],
            };
            for &kind in meridian_protocols::ProtocolKind::ALL {
                let protocol = kind.name();
                if listed.contains(&protocol) {
                    continue;
                }
                let layouts_ok = replicas.iter().all(|&r| {
                    let topology =
                        meridian_core::topology::Topology::standard(vec!["r".into()], 2, r)
                            .expect("a layout");
                    kind.check_topology(&topology).is_ok()
                });
                let runs_all = layouts_ok
                    && workloads.iter().all(|&workload| {
                        let options = meridian_workloads::WorkloadOptions {
                            shards: 2,
                            keys_per_shard: 1_000,
                            tpcc: tpcc.clone(),
                            ..meridian_workloads::WorkloadOptions::default()
                        };
                        let built = meridian_workloads::build(workload, &options).expect("builds");
                        let topology =
                            meridian_core::topology::Topology::standard(vec!["r".into()], 2, 1)
                                .expect("a layout");
                        kind.check_workload(&meridian_workloads::sample(built.as_ref()), &topology)
                            .is_ok()
                    });
                assert!(!runs_all, "preset {name} leaves out {protocol}, which runs {workloads:?}");
            }
        }
    }
}
