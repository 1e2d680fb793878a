//! Regressions from published list-append and rw-register histories that the checker once
//! judged wrongly: each anomalous history must report its class, and the valid variant next to
//! it must pass.

use meridian_check::history::{History, Model};
use meridian_check::{check, Consistency, Report};

const LA: Model = Model::ListAppend;
const RR: Model = Model::RwRegister;
const SER: Consistency = Consistency::Serializable;
const STRICT: Consistency = Consistency::StrictSerializable;

/// One transaction per row, `(process, completion type, completed mops)`, each invoked and then
/// completed before the next row; the invocation carries the same mops with reads unknown.
fn history(rows: &[(u64, &str, &str)]) -> String {
    let mut lines = Vec::new();
    for &(process, kind, value) in rows {
        let mut invoked: Vec<serde_json::Value> = serde_json::from_str(value).expect("test mops");
        for mop in &mut invoked {
            if mop[0] == "r" {
                mop[2] = serde_json::Value::Null;
            }
        }
        let invoked = serde_json::to_string(&invoked).expect("json");
        for (kind, value) in [("invoke", invoked.as_str()), (kind, value)] {
            let index = lines.len();
            lines.push(format!(
                r#"{{"index":{index},"process":{process},"type":"{kind}","f":"txn","value":{value}}}"#
            ));
        }
    }
    format!("[{}]", lines.join(",\n"))
}

fn report(model: Model, consistency: Consistency, text: &str) -> Report {
    let parsed = History::parse(text, model).expect("the test history parses");
    check(&parsed, model, consistency).expect("checkable").0
}

/// The classes found under both consistency models (they must agree: none of these histories
/// depends on real time), and the verdict must match them.
fn classes(model: Model, rows: &[(u64, &str, &str)]) -> Vec<String> {
    let text = history(rows);
    let mut found = Vec::new();
    for consistency in [SER, STRICT] {
        let report = report(model, consistency, &text);
        let classes: Vec<String> = report.classes().iter().map(|c| c.to_string()).collect();
        assert_eq!(report.valid, classes.is_empty(), "{:?}", report.anomalies);
        found.push(classes);
    }
    assert_eq!(found[0], found[1], "serializable and strict agree here");
    found.swap_remove(0)
}

#[test]
fn every_element_of_a_read_is_checked_for_aborted_appends() {
    // The failed append of 2 sits in the middle of the read: G1a, and a committed append (3)
    // was made on top of the aborted one: a dirty update.
    let middle = [
        (0, "ok", r#"[["append",1,1]]"#),
        (1, "fail", r#"[["append",1,2]]"#),
        (2, "ok", r#"[["append",1,3]]"#),
        (3, "ok", r#"[["r",1,[1,2,3]]]"#),
    ];
    assert_eq!(classes(LA, &middle), ["G1a", "dirty-update"]);
    // An aborted element first in a shorter read, with the longest read elsewhere.
    let first = [
        (1, "fail", r#"[["append",1,2]]"#),
        (3, "ok", r#"[["r",1,[2]]]"#),
        (2, "ok", r#"[["append",1,3]]"#),
        (0, "ok", r#"[["r",1,[2,3]]]"#),
    ];
    assert_eq!(classes(LA, &first), ["G1a", "dirty-update"]);
    // The same reads with every append committed are fine.
    let valid = [
        (0, "ok", r#"[["append",1,1]]"#),
        (1, "ok", r#"[["append",1,2]]"#),
        (2, "ok", r#"[["append",1,3]]"#),
        (3, "ok", r#"[["r",1,[1,2,3]]]"#),
    ];
    assert_eq!(classes(LA, &valid), Vec::<String>::new());
}

#[test]
fn a_read_of_its_own_later_append_is_a_future_read() {
    let list = [(0, "ok", r#"[["r",1,[1]],["append",1,1]]"#)];
    assert_eq!(classes(LA, &list), ["future-read"]);
    let later_in_list =
        [(0, "ok", r#"[["append",1,5]]"#), (1, "ok", r#"[["r",1,[5,6]],["append",1,6]]"#)];
    assert_eq!(classes(LA, &later_in_list), ["future-read"]);
    let list_valid = [(0, "ok", r#"[["r",1,[]],["append",1,1],["r",1,[1]]]"#)];
    assert_eq!(classes(LA, &list_valid), Vec::<String>::new());
    let register = [(0, "ok", r#"[["r",1,1],["w",1,1]]"#)];
    assert_eq!(classes(RR, &register), ["future-read"]);
    let register_valid = [(0, "ok", r#"[["r",1,null],["w",1,1],["r",1,1]]"#)];
    assert_eq!(classes(RR, &register_valid), Vec::<String>::new());
}

#[test]
fn reads_after_own_appends_order_the_list() {
    // Each transaction reads keys after appending to them. T1 sees T0's append to x (its read
    // [1, 2] minus its own 2), T0 sees T1's append to y: circular information flow.
    let g1c = [
        (0, "ok", r#"[["append","x",1],["r","x",[1]],["r","y",[1]]]"#),
        (1, "ok", r#"[["append","x",2],["r","x",[1,2]],["append","y",1]]"#),
    ];
    assert_eq!(classes(LA, &g1c), ["G1c"]);
    // T1 sees T0's append to x but read y before T0's append to y (which only T0's own read,
    // after the append, shows): read skew.
    let g_single = [
        (0, "ok", r#"[["append","x",1],["r","x",[1]],["append","y",1],["r","y",[1]]]"#),
        (1, "ok", r#"[["append","x",2],["r","x",[1,2]],["r","y",[]]]"#),
    ];
    assert_eq!(classes(LA, &g_single), ["G-single"]);
    // T1 after T0, seeing all of it, is fine.
    let valid = [
        (0, "ok", r#"[["append","x",1],["r","x",[1]],["append","y",1],["r","y",[1]]]"#),
        (1, "ok", r#"[["append","x",2],["r","x",[1,2]],["r","y",[1]]]"#),
    ];
    assert_eq!(classes(LA, &valid), Vec::<String>::new());
}

#[test]
fn appends_no_read_observed_follow_every_read() {
    // T0's appends of 1 and 3 must be adjacent; a read shows T1's 2 right after 1, so 3 (never
    // read) follows 2: T0 -> T1 -> T0, a write cycle.
    let split = [
        (0, "ok", r#"[["append",1,1],["append",1,3]]"#),
        (1, "ok", r#"[["append",1,2]]"#),
        (2, "ok", r#"[["r",1,[1,2]]]"#),
    ];
    assert_eq!(classes(LA, &split), ["G0"]);
    // A read of T0's second append without its first: the first, never read, comes after
    // that read, yet T0 appended it before: T1 -> T0 -> T1.
    let missing_first =
        [(0, "ok", r#"[["append",1,1],["append",1,2]]"#), (1, "ok", r#"[["r",1,[2]]]"#)];
    assert_eq!(classes(LA, &missing_first), ["G-single"]);
    // The same when the read that shows both is T0's own, after its appends.
    let shown_by_own_read = [
        (0, "ok", r#"[["append",1,1],["append",1,2],["r",1,[1,2]]]"#),
        (1, "ok", r#"[["r",1,[2]]]"#),
    ];
    assert_eq!(classes(LA, &shown_by_own_read), ["incompatible-order"]);
    let valid = [
        (0, "ok", r#"[["append",1,1],["append",1,3]]"#),
        (1, "ok", r#"[["append",1,2]]"#),
        (2, "ok", r#"[["r",1,[1,3,2]]]"#),
    ];
    assert_eq!(classes(LA, &valid), Vec::<String>::new());
}

#[test]
fn nemesis_operations_and_info_completions_without_a_value_are_understood() {
    // As elle-cli writes them: the nemesis is a process named by a string, with its own `f`
    // and free-form values; an info completion may carry a null value.
    let text = r#"[
{"index":0,"process":"nemesis","type":"info","f":"start-partition","value":null},
{"index":1,"process":0,"type":"invoke","f":"txn","value":[["append",1,1],["r",2,null]]},
{"index":2,"process":"nemesis","type":"info","f":"start-partition","value":[["n1","n2"],["n3"]]},
{"index":3,"process":0,"type":"info","f":"txn","value":null},
{"index":4,"process":1,"type":"invoke","f":"txn","value":[["append",2,1]]},
{"index":5,"process":1,"type":"info","f":"txn","value":null},
{"index":6,"process":2,"type":"invoke","f":"txn","value":[["r",1,null]]},
{"index":7,"process":2,"type":"ok","f":"txn","value":[["r",1,[1]]]}
]"#;
    for consistency in [SER, STRICT] {
        let report = report(LA, consistency, text);
        assert!(report.valid, "{:?}", report.anomalies);
        assert_eq!(report.txns, [1, 0, 2]);
    }
    let parsed = History::parse(text, LA).expect("parses");
    assert_eq!(parsed.ops.len(), 6, "the nemesis operations are skipped");
    let txns = parsed.transactions().expect("pairs");
    assert_eq!(txns[0].mops.len(), 2, "an info completion keeps the invocation's mops");
    // The unknown transaction that was observed counts as committed and takes part in cycles.
    let cycle = r#"[
{"index":0,"process":0,"type":"invoke","f":"txn","value":[["append",1,1],["append",2,1]]},
{"index":1,"process":0,"type":"info","f":"txn","value":null},
{"index":2,"process":1,"type":"invoke","f":"txn","value":[["r",1,null],["r",2,null]]},
{"index":3,"process":1,"type":"ok","f":"txn","value":[["r",1,[1]],["r",2,[]]]}
]"#;
    let report = report(LA, SER, cycle);
    assert_eq!(report.classes(), ["G-single"]);
    // A null value anywhere else is still refused, and so is a null process.
    let null_ok =
        r#"[{"process":0,"type":"invoke","value":[]},{"process":0,"type":"ok","value":null}]"#;
    assert!(History::parse(null_ok, LA).is_err());
}
