use super::*;

const GOOD: &str = r#"
source = "a study, table 2"
[[cell]]
protocol = "luigi"
network = "metro"
clients = 1
throughput_txn_per_s = 100
latency_ms_mean = 9.5
[[cell]]
protocol = "luigi"
network = "metro"
clients = 8
throughput_txn_per_s = 400
"#;

fn flags(words: &str) -> Vec<String> {
    words.split_whitespace().map(String::from).collect()
}

/// A saved run of `protocol` on `network` with `clients` and `txn_per_s`.
fn run(protocol: &str, network: &str, clients: u64, txn_per_s: f64) -> SavedRun {
    let json = serde_json::json!({
        "parameters": {
            "protocol": protocol, "clients": clients, "shards": 2, "replicas": 3,
            "network": {"name": network}, "workload": {"name": "micro-luigi"},
        },
        "summary": crate::stats::RunStats::new(0, 1).summary(),
    });
    let mut run: SavedRun = serde_json::from_value(json).unwrap();
    run.summary.throughput_txn_per_s = txn_per_s;
    run.summary.latency_ms_mean = 10.0;
    run
}

#[test]
fn a_reference_file_parses_into_cells() {
    let r = Reference::parse(GOOD, "r.toml").unwrap();
    assert_eq!(r.source, "a study, table 2");
    assert_eq!(r.cells.len(), 2);
    assert_eq!(r.cells[0].name(), "clients=1 network=metro protocol=luigi");
    assert_eq!(r.cells[0].figures["latency_ms_mean"], 9.5);
}

#[test]
fn bad_reference_files_are_refused_with_the_cell_named() {
    let cases = [
        ("[[cell]]\nprotocol = \"occ\"\nthroughput_txn_per_s = 1\n", "'source' must name"),
        ("source = \"s\"\n", "no [[cell]] tables"),
        ("source = \"s\"\ncolour = 1\n", "unknown key 'colour'"),
        ("source = \"s\"\n[[cell]]\nprotocol = \"occ\"\n", "cell 1: a cell names its run and at least one figure"),
        ("source = \"s\"\n[[cell]]\nthroughput_txn_per_s = 5\n", "cell 1: a cell names"),
        ("source = \"s\"\n[[cell]]\nprotocol = \"occ\"\nthroughput_txn_per_s = -5\n", "must be above 0"),
        ("source = \"s\"\n[[cell]]\nprotocol = \"occ\"\nthroughput_txn_per_s = \"fast\"\n", "must be a number"),
        ("source = \"s\"\n[[cell]]\nprotocl = \"occ\"\nthroughput_txn_per_s = 5\n", "cell 1: unknown key 'protocl'"),
        ("source = \"s\"\n[[cell]]\nclients = 1.5\nthroughput_txn_per_s = 5\n", "must be a string or a whole number"),
        (
            "source = \"s\"\n[[cell]]\nclients = 1\nthroughput_txn_per_s = 5\n[[cell]]\nclients = 1\nlatency_ms_p50 = 3\n",
            "cell 2: 'clients=1' is given twice",
        ),
        ("source = \n", "r.toml:"),
    ];
    for (text, expected) in cases {
        let why = Reference::parse(text, "r.toml").unwrap_err();
        assert!(why.contains(expected), "{text}: '{why}' lacks '{expected}'");
    }
}

#[test]
fn cells_must_fall_on_the_grid() {
    let r = Reference::parse(GOOD, "r.toml").unwrap();
    let grid = [
        flags("--protocol luigi --network metro --clients 1"),
        flags("--protocol luigi --network metro --clients 8"),
        flags("--protocol occ --network metro --clients 8"),
    ];
    assert!(r.check_grid(&grid).is_ok());
    let why = r.check_grid(&grid[..1]).unwrap_err();
    assert!(why.contains("'clients=8 network=metro protocol=luigi' matches no run"), "{why}");
    // A value must match exactly: clients 18 is not clients 8.
    assert!(r
        .check_grid(&[grid[0].clone(), flags("--protocol luigi --network metro --clients 18")])
        .is_err());
}

#[test]
fn the_section_gives_ratios_and_judges_thread_scaling() {
    let r = Reference::parse(GOOD, "r.toml").unwrap();
    // Ours: 200 -> 1,000 (5x) where the study went 100 -> 400 (4x): within 30%, the shape holds.
    let runs = [
        run("luigi", "metro", 1, 200.0),
        run("luigi", "metro", 8, 1_000.0),
        run("occ", "metro", 8, 50.0),
    ];
    let md = section(&r, &runs);
    assert!(md.contains("Source: a study, table 2."), "{md}");
    assert!(md.contains("| clients=1 network=metro protocol=luigi | throughput_txn_per_s | 100.0 | 200.0 | 2.00 |"), "{md}");
    assert!(md.contains("| latency_ms_mean | 9.5 | 10.0 | 1.05 |"), "{md}");
    assert!(md.contains("| network=metro protocol=luigi | 1 → 8 | 4.00 | 5.00 | holds |"), "{md}");
    // Ours flat: 8x the clients for 1.5x the throughput: the shape differs.
    let flat = [run("luigi", "metro", 1, 200.0), run("luigi", "metro", 8, 300.0)];
    assert!(section(&r, &flat).contains("| 4.00 | 1.50 | differs |"));
    // A quick grid that ran one cell: the other is counted as not run, no scaling line.
    let one = section(&r, &runs[..1]);
    assert!(one.contains("1 published cells were not among these runs."), "{one}");
    assert!(!one.contains("Thread scaling"), "{one}");
}

#[test]
fn the_section_says_who_wins_each_setting() {
    let text = r#"
source = "s"
[[cell]]
protocol = "luigi"
tpcc_mode = "paper-compat"
network = "geo"
throughput_txn_per_s = 2651
[[cell]]
protocol = "mako"
tpcc_mode = "spec"
network = "geo"
throughput_txn_per_s = 42.9
"#;
    let r = Reference::parse(text, "r.toml").unwrap();
    let with_mode = |protocol: &str, mode: &str, txn_per_s: f64| {
        let mut saved = run(protocol, "geo", 8, txn_per_s);
        saved.parameters["workload"]["mode"] = mode.into();
        saved
    };
    let agree = [with_mode("luigi", "paper-compat", 900.0), with_mode("mako", "spec", 30.0)];
    let md = section(&r, &agree);
    assert!(md.contains("| network=geo | luigi | luigi | holds |"), "{md}");
    let disagree = [with_mode("luigi", "paper-compat", 20.0), with_mode("mako", "spec", 30.0)];
    assert!(section(&r, &disagree).contains("| network=geo | luigi | mako | differs |"));
    // One protocol ran: no verdict.
    assert!(!section(&r, &agree[..1]).contains("Who wins"));
}
