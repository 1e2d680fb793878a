//! The checker on hand-made histories: each anomaly class is caught, valid histories pass,
//! and bad input is refused with a message that says where.

use meridian_check::history::{History, Model};
use meridian_check::{check, Consistency, Report};

/// A history from `(process, type, invoke value, completion value)` rows: each row is an
/// invocation immediately followed by its completion, unless its type is `"open"` (invoked and
/// never completed) or the row is split with `Step::Invoke`/`Step::Complete`.
enum Step {
    Txn(u64, &'static str, &'static str),
    Invoke(u64, &'static str),
    Complete(u64, &'static str, &'static str),
}
use Step::{Complete, Invoke, Txn};

fn reads_unknown(value: &str) -> String {
    // The invocation of a read does not know its value yet.
    let mut parts: Vec<serde_json::Value> = serde_json::from_str(value).expect("test mops");
    for mop in &mut parts {
        if mop[0] == "r" {
            mop[2] = serde_json::Value::Null;
        }
    }
    serde_json::to_string(&parts).expect("json")
}

fn history(steps: &[Step]) -> String {
    let mut lines = Vec::new();
    let mut push = |process: u64, kind: &str, value: &str| {
        let index = lines.len();
        lines.push(format!(
            r#"{{"index":{index},"process":{process},"type":"{kind}","f":"txn","value":{value}}}"#
        ));
    };
    for step in steps {
        match step {
            Txn(p, kind, value) => {
                push(*p, "invoke", &reads_unknown(value));
                push(*p, kind, value);
            }
            Invoke(p, value) => push(*p, "invoke", &reads_unknown(value)),
            Complete(p, kind, value) => push(*p, kind, value),
        }
    }
    format!("[{}]", lines.join(",\n"))
}

fn run(model: Model, consistency: Consistency, steps: &[Step]) -> Report {
    let text = history(steps);
    let parsed = History::parse(&text, model).expect("the test history parses");
    check(&parsed, model, consistency).expect("checkable").0
}

fn classes(model: Model, consistency: Consistency, steps: &[Step]) -> Vec<String> {
    let report = run(model, consistency, steps);
    let classes: Vec<String> = report.classes().iter().map(|c| c.to_string()).collect();
    assert_eq!(
        report.valid,
        classes
            .iter()
            .all(|c| c.ends_with("-realtime") && consistency == Consistency::Serializable),
        "verdict and classes agree"
    );
    classes
}

const LA: Model = Model::ListAppend;
const RR: Model = Model::RwRegister;
const SER: Consistency = Consistency::Serializable;
const STRICT: Consistency = Consistency::StrictSerializable;

#[test]
fn list_append_valid_histories_pass_both_models() {
    let serial = [
        Txn(0, "ok", r#"[["append",1,1],["r",2,[]]]"#),
        Txn(1, "ok", r#"[["r",1,[1]],["append",2,1],["append",1,2]]"#),
        Txn(0, "ok", r#"[["r",1,[1,2]],["r",2,[1]]]"#),
        Txn(2, "fail", r#"[["append",1,3]]"#),
        Txn(1, "ok", r#"[["r",1,[1,2]]]"#),
    ];
    for consistency in [SER, STRICT] {
        let report = run(LA, consistency, &serial);
        assert!(report.valid, "{:?}", report.anomalies);
        assert_eq!(report.txns, [4, 1, 0]);
    }
    // Concurrent transactions in either order.
    let concurrent = [
        Invoke(0, r#"[["append",1,1]]"#),
        Invoke(1, r#"[["r",1,[]]]"#),
        Complete(0, "ok", r#"[["append",1,1]]"#),
        Complete(1, "ok", r#"[["r",1,[]]]"#),
    ];
    assert!(run(LA, STRICT, &concurrent).valid);
}

#[test]
fn g0_write_cycle() {
    let steps = [
        Txn(0, "ok", r#"[["append",1,1],["append",2,1]]"#),
        Txn(1, "ok", r#"[["append",1,2],["append",2,2]]"#),
        Txn(2, "ok", r#"[["r",1,[1,2]],["r",2,[2,1]]]"#),
    ];
    assert_eq!(classes(LA, SER, &steps), ["G0"]);
}

#[test]
fn g1a_aborted_read() {
    let steps = [Txn(0, "fail", r#"[["append",1,1]]"#), Txn(1, "ok", r#"[["r",1,[1]]]"#)];
    assert_eq!(classes(LA, SER, &steps), ["G1a"]);
}

#[test]
fn g1b_intermediate_read() {
    let steps =
        [Txn(0, "ok", r#"[["append",1,1],["append",1,2]]"#), Txn(1, "ok", r#"[["r",1,[1]]]"#)];
    // The append of 2, which no read shows, comes after the read, so the reader also
    // anti-depends on the writer it read from: the same anomaly seen as a cycle (as in Elle).
    assert_eq!(classes(LA, SER, &steps), ["G-single", "G1b"]);
}

#[test]
fn g1c_circular_information_flow() {
    let steps = [
        Invoke(0, r#"[["append",1,1],["r",2,[1]]]"#),
        Invoke(1, r#"[["append",2,1],["r",1,[1]]]"#),
        Complete(0, "ok", r#"[["append",1,1],["r",2,[1]]]"#),
        Complete(1, "ok", r#"[["append",2,1],["r",1,[1]]]"#),
    ];
    assert_eq!(classes(LA, SER, &steps), ["G1c"]);
}

#[test]
fn g_single_read_skew() {
    // T0 installs 1 on both keys; T1 appends after T0 on key 1 but read key 2 before T0.
    let steps = [
        Txn(0, "ok", r#"[["append",1,1],["append",2,1]]"#),
        Txn(1, "ok", r#"[["append",1,2],["r",2,[]]]"#),
        Txn(2, "ok", r#"[["r",1,[1,2]]]"#),
    ];
    assert_eq!(classes(LA, SER, &steps), ["G-single"]);
}

#[test]
fn g2_write_skew() {
    let steps = [
        Invoke(0, r#"[["r",1,[]],["r",2,[]],["append",1,1]]"#),
        Invoke(1, r#"[["r",1,[]],["r",2,[]],["append",2,1]]"#),
        Complete(0, "ok", r#"[["r",1,[]],["r",2,[]],["append",1,1]]"#),
        Complete(1, "ok", r#"[["r",1,[]],["r",2,[]],["append",2,1]]"#),
    ];
    assert_eq!(classes(LA, SER, &steps), ["G2"]);
}

#[test]
fn stale_read_is_serializable_but_not_strict() {
    let steps = [Txn(0, "ok", r#"[["append",1,1]]"#), Txn(1, "ok", r#"[["r",1,[]]]"#)];
    assert!(run(LA, SER, &steps).valid);
    let strict = run(LA, STRICT, &steps);
    assert!(!strict.valid);
    assert_eq!(strict.classes(), ["G-single-realtime"]);
    assert_eq!(strict.anomalies[0].cycle.len(), 2);
}

#[test]
fn direct_anomalies() {
    let internal = [Txn(0, "ok", r#"[["append",1,1],["r",1,[]]]"#)];
    assert_eq!(classes(LA, SER, &internal), ["internal"]);
    let incompatible = [
        Txn(0, "ok", r#"[["append",1,1]]"#),
        Txn(1, "ok", r#"[["append",1,2]]"#),
        Txn(2, "ok", r#"[["r",1,[1,2]]]"#),
        Txn(3, "ok", r#"[["r",1,[2,1]]]"#),
    ];
    assert!(classes(LA, SER, &incompatible).contains(&"incompatible-order".to_string()));
    let garbage = [Txn(0, "ok", r#"[["r",1,[9]]]"#)];
    assert_eq!(classes(LA, SER, &garbage), ["garbage-read"]);
    let duplicate = [Txn(0, "ok", r#"[["append",1,1]]"#), Txn(1, "ok", r#"[["r",1,[1,1]]]"#)];
    assert_eq!(classes(LA, SER, &duplicate), ["duplicate-elements"]);
}

#[test]
fn unknown_outcomes_count_as_committed_only_when_observed() {
    // An info append that someone read committed; one nobody read did not.
    let steps = [
        Txn(0, "info", r#"[["append",1,1]]"#),
        Txn(1, "info", r#"[["append",2,1]]"#),
        Txn(2, "ok", r#"[["r",1,[1]],["r",2,[]]]"#),
    ];
    let report = run(LA, STRICT, &steps);
    assert!(report.valid, "{:?}", report.anomalies);
    assert_eq!(report.txns, [1, 0, 2]);
}

#[test]
fn rw_register_classes() {
    let valid = [
        Txn(0, "ok", r#"[["w",1,1]]"#),
        Txn(1, "ok", r#"[["r",1,1],["w",1,2]]"#),
        Txn(2, "ok", r#"[["r",1,2]]"#),
    ];
    assert!(run(RR, STRICT, &valid).valid);
    let aborted = [Txn(0, "fail", r#"[["w",1,1]]"#), Txn(1, "ok", r#"[["r",1,1]]"#)];
    assert_eq!(classes(RR, SER, &aborted), ["G1a"]);
    let intermediate = [Txn(0, "ok", r#"[["w",1,1],["w",1,2]]"#), Txn(1, "ok", r#"[["r",1,1]]"#)];
    assert_eq!(classes(RR, SER, &intermediate), ["G1b"]);
    let read_skew =
        [Txn(0, "ok", r#"[["w",1,1],["w",2,1]]"#), Txn(1, "ok", r#"[["r",1,1],["r",2,null]]"#)];
    assert_eq!(classes(RR, SER, &read_skew), ["G-single"]);
    let write_skew = [
        Invoke(0, r#"[["r",1,null],["r",2,null],["w",1,1]]"#),
        Invoke(1, r#"[["r",1,null],["r",2,null],["w",2,2]]"#),
        Complete(0, "ok", r#"[["r",1,null],["r",2,null],["w",1,1]]"#),
        Complete(1, "ok", r#"[["r",1,null],["r",2,null],["w",2,2]]"#),
    ];
    assert_eq!(classes(RR, SER, &write_skew), ["G2"]);
    let lost_update = [
        Invoke(0, r#"[["r",1,null],["w",1,1]]"#),
        Invoke(1, r#"[["r",1,null],["w",1,2]]"#),
        Complete(0, "ok", r#"[["r",1,null],["w",1,1]]"#),
        Complete(1, "ok", r#"[["r",1,null],["w",1,2]]"#),
    ];
    assert_eq!(classes(RR, SER, &lost_update), ["G2"]);
}

#[test]
fn bad_histories_are_refused_with_the_line() {
    let truncated = "[{\"index\":0,\"process\":0,\"type\":\"invoke\",\"value\":[]},\n{\"index\":1,";
    let e = History::parse(truncated, LA).expect_err("truncated");
    assert_eq!(e.line, Some(2), "{e}");
    let orphan = "[{\"index\":0,\"process\":0,\"type\":\"ok\",\"value\":[[\"append\",1,1]]}]";
    let e = History::parse(orphan, LA).expect_err("completion without invocation");
    assert!(e.to_string().contains("no open invocation"), "{e}");
    let lines = "{\"process\":0,\"type\":\"invoke\",\"value\":[]}\n{\"process\":0,\"type\":\"done\",\"value\":[]}\n";
    let e = History::parse(lines, LA).expect_err("unknown type");
    assert_eq!(e.line, Some(2));
    assert!(e.to_string().contains("accepted: invoke, ok, fail, info"), "{e}");
    let mismatch =
        history(&[Invoke(0, r#"[["append",1,1]]"#), Complete(0, "ok", r#"[["append",1,2]]"#)]);
    let e = History::parse(&mismatch, LA).expect_err("mismatch");
    assert!(e.to_string().contains("does not match"), "{e}");
    let not_int = history(&[Txn(0, "ok", r#"[["append",1,"x"]]"#)]);
    assert_eq!(History::parse(&not_int, LA).expect_err("string element").line, Some(1));
    let duplicate_write =
        history(&[Txn(0, "ok", r#"[["w",1,1]]"#), Txn(1, "ok", r#"[["w",1,1]]"#)]);
    let parsed = History::parse(&duplicate_write, RR).expect("parses");
    let e = check(&parsed, RR, SER).expect_err("values must be unique");
    assert!(e.to_string().contains("unique"), "{e}");
}

#[test]
fn export_round_trips() {
    let text = history(&[
        Txn(0, "ok", r#"[["append",1,1],["r","k",[]]]"#),
        Txn(1, "fail", r#"[["append","k",1]]"#),
        Invoke(2, r#"[["r",1,[1]]]"#),
    ]);
    let parsed = History::parse(&text, LA).expect("parses");
    let again = History::parse(&parsed.to_json(), LA).expect("export parses");
    assert_eq!(parsed, again);
}

#[test]
fn mutated_histories_never_panic() {
    // A bounded property test: byte-level mutations of a valid history either parse and check,
    // or are refused with an error; nothing panics.
    let base = history(&[
        Txn(0, "ok", r#"[["append",1,1],["r",2,[]]]"#),
        Txn(1, "ok", r#"[["r",1,[1]],["append",2,1]]"#),
        Txn(2, "info", r#"[["append",1,2]]"#),
        Txn(0, "ok", r#"[["r",1,[1,2]],["r",2,[1]]]"#),
    ]);
    let alphabet = b"[]{},:\"0123456789-abcdefghijklmnopqrstuvwxyz \n";
    let mut rng = meridian_core::rng::child_rng(11, "history-property", 0);
    for _ in 0..3_000 {
        let bytes = meridian_core::testing::mutate(&mut rng, base.as_bytes(), alphabet, 4);
        let Ok(text) = String::from_utf8(bytes) else { continue };
        for model in [LA, RR] {
            if let Ok(parsed) = History::parse(&text, model) {
                let _ = check(&parsed, model, STRICT);
            }
        }
    }
}

#[test]
fn with_recorded_times_equal_times_are_concurrent() {
    // T0 appends and completes at time 10; T1 reads the empty list, invoked at `t1`.
    let text = |t1: u64| {
        format!(
            "{{\"process\":0,\"type\":\"invoke\",\"time\":5,\"value\":[[\"append\",1,1]]}}\n\
             {{\"process\":0,\"type\":\"ok\",\"time\":10,\"value\":[[\"append\",1,1]]}}\n\
             {{\"process\":1,\"type\":\"invoke\",\"time\":{t1},\"value\":[[\"r\",1,null]]}}\n\
             {{\"process\":1,\"type\":\"ok\",\"time\":20,\"value\":[[\"r\",1,[]]]}}\n"
        )
    };
    let verdict = |t1| {
        let history = History::parse(&text(t1), LA).expect("parses");
        check(&history, LA, STRICT).expect("checks").0.valid
    };
    assert!(verdict(10), "invoked when the other completed: concurrent, may read before it");
    assert!(!verdict(11), "invoked after the other completed: must see its append");
}

#[test]
fn a_stale_register_read_breaks_strict_serializability_only() {
    // T0 writes 1, then T1 overwrites it with 2, then T2 (invoked after both finished) reads 1.
    let steps = [
        Txn(0, "ok", r#"[["w",1,1]]"#),
        Txn(1, "ok", r#"[["w",1,2]]"#),
        Txn(2, "ok", r#"[["r",1,1]]"#),
    ];
    assert!(run(RR, SER, &steps).valid, "serializable: T2 may come before T1");
    let strict = run(RR, STRICT, &steps);
    assert!(!strict.valid);
    assert_eq!(strict.classes(), ["G-single-realtime"]);
    // Reading the newest value is fine.
    let fresh = [
        Txn(0, "ok", r#"[["w",1,1]]"#),
        Txn(1, "ok", r#"[["w",1,2]]"#),
        Txn(2, "ok", r#"[["r",1,2]]"#),
    ];
    assert!(run(RR, STRICT, &fresh).valid);
    // Concurrent writers give no order, so either value may be read.
    let concurrent = [
        Txn(0, "ok", r#"[["w",1,1]]"#),
        Invoke(1, r#"[["w",1,2]]"#),
        Invoke(2, r#"[["r",1,1]]"#),
        Complete(1, "ok", r#"[["w",1,2]]"#),
        Complete(2, "ok", r#"[["r",1,1]]"#),
    ];
    assert!(run(RR, STRICT, &concurrent).valid);
}
