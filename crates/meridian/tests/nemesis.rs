//! `meridian nemesis` end to end: a 1 × 3 cluster of server processes of every protocol under
//! a schedule with every fault kind (crash, pause, isolate, partition, clock, disk), checked
//! for lost acknowledged writes, history anomalies and unequal replicas; and a bad schedule
//! refused before anything starts.

#[allow(dead_code)] // Each test binary uses part of the helpers.
mod common;

use common::meridian;

/// Every fault kind once, in 14 s: the last 5 s are quiet. Each protocol's run adds a disk
/// failure of its own kind (`disk-fail`).
const SCHEDULE: [&str; 7] = [
    "crash leader=0 at=1s restart=1800ms",
    "clock node=2 at=1s step=+200ms",
    "disk node=2 at=2s until=3500ms delay=20ms",
    "pause node=1 at=2500ms until=3500ms",
    "isolate leader=0 at=4s until=5s",
    "partition regions=r0|r1,r2 at=5500ms until=7s",
    "clock node=2 at=7500ms step=-200ms",
];

#[test]
fn every_protocol_survives_every_fault_kind_on_server_processes() {
    let out = std::env::temp_dir().join(format!("meridian-nemesis-{}", std::process::id()));
    let protocols = ["occ", "2pl", "2pc-mvto", "mako", "chain", "tiga", "luigi"];
    for (i, protocol) in protocols.into_iter().enumerate() {
        let mut command = meridian();
        command.args(["--log-level", "error", "nemesis", "--protocol", protocol]);
        command.args(["--shards", "1", "--replicas", "3", "--duration", "14", "--clients", "6"]);
        for line in SCHEDULE {
            command.args(["--fault", line]);
        }
        let what = ["torn", "fsync", "full"][i % 3];
        // Half the protocols over mutual TLS (a certificate per node from a test CA).
        let tls = i % 2 == 1;
        if tls {
            command.arg("--tls");
        }
        command.args(["--fault", &format!("disk-fail node=2 at=8s what={what} restart=9s")]);
        let output = command.arg("--out").arg(&out).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{protocol}:\n{stdout}\n{stderr}");
        for line in [
            "faults injected: clock 2, crash 1, disk 1, disk-fail 1, isolate 1, partition 1, pause 1",
            "had stopped on the failure (exit status: 3); start n2",
            "history elle-list-append: PASS",
            "replicas: every shard's replicas hold the same state",
            "\nlost 0\n",
            "anomalies: none",
            "REPRODUCE: meridian nemesis --protocol",
        ] {
            assert!(stdout.contains(line), "{protocol}: no '{line}' in\n{stdout}");
        }
        assert!(!stdout.contains("FAILED"), "{protocol}: a fault step failed:\n{stdout}");
        let transport = if tls { "; mutual TLS;" } else { "; plain TCP (insecure = true);" };
        assert!(stdout.lines().next().unwrap().contains(transport), "{protocol}: {stdout}");
        // The run's folder is named on the first line; node 2 stopped on the injected failure.
        let folder = stdout.lines().next().and_then(|l| l.split("files in ").nth(1)).unwrap();
        let log = std::fs::read_to_string(std::path::Path::new(folder).join("node-2.log"));
        let log = log.unwrap();
        assert!(log.contains("(injected)") && log.contains("stopping"), "{protocol}: {log}");
        eprintln!(
            "{protocol}: {}",
            stdout.lines().find(|l| l.starts_with("operations")).unwrap_or("")
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_schedule_naming_a_node_outside_the_layout_starts_nothing() {
    let out = std::env::temp_dir().join(format!("meridian-nemesis-bad-{}", std::process::id()));
    let output = meridian()
        .args(["nemesis", "--protocol", "occ", "--duration", "12", "--fault"])
        .arg("crash node=42 at=1s restart=2s")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("node 42 does not exist"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(!out.exists(), "nothing is made for a refused schedule");
}
