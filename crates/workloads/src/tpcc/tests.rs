use super::check::{check_database, check_load_only};
use super::load::{SMALL, SPEC};
use super::procs::{LineRequest, NewOrderArgs, PaymentArgs, STOCK_LEVEL_ORDERS};
use super::schema::*;
use super::*;
use crate::testkit::{apply_serially, completion, loaded_stores};
use crate::CheckResult;
use meridian_core::key::Key;
use meridian_core::time::Timestamp;
use meridian_core::txn::TxnResult;
use meridian_core::{NodeId, TxnId};
use meridian_storage::VersionState;

fn options(shards: u32, per_shard: u64, scale: Scale) -> WorkloadOptions {
    WorkloadOptions {
        shards,
        tpcc: TpccOptions { warehouses_per_shard: per_shard, scale, ..TpccOptions::default() },
        ..WorkloadOptions::default()
    }
}

fn small(shards: u32, per_shard: u64) -> (Tpcc, Vec<MvccStore>) {
    let tpcc = Tpcc::new(&options(shards, per_shard, SMALL)).unwrap();
    let stores = loaded_stores(&tpcc, shards);
    (tpcc, stores)
}

fn refs(stores: &[MvccStore]) -> Vec<(ShardId, &MvccStore)> {
    stores.iter().enumerate().map(|(i, s)| (ShardId(i as u32), s)).collect()
}

fn failed(results: &[CheckResult]) -> Vec<String> {
    results.iter().filter(|r| !r.passed).map(|r| format!("{}: {}", r.name, r.detail)).collect()
}

fn assert_consistent(tpcc: &Tpcc, stores: &[MvccStore]) {
    let results = check_database(&tpcc.layout(), &refs(stores));
    assert_eq!(results.len(), 14, "decode, 11 conditions, 2 bookkeeping checks");
    assert!(failed(&results).is_empty(), "{:#?}", failed(&results));
}

fn count(store: &MvccStore, table: u8) -> usize {
    store.latest_range(&Key::table(table).build(), &Key::table(table + 1).build()).count()
}

fn row<R: Row>(stores: &[MvccStore], shard: usize, key: &Key) -> R {
    R::decode(stores[shard].get_at(key, Timestamp::MAX).map(Vec::as_slice)).unwrap()
}

/// Overwrites `key` on `shard` as a bug would, at a fresh timestamp.
fn corrupt(stores: &mut [MvccStore], shard: usize, key: Key, value: Option<Vec<u8>>) {
    let ts = Timestamp(u64::MAX / 2);
    stores[shard]
        .write(
            key,
            ts,
            value,
            TxnId { origin: NodeId(9), incarnation: 0, seq: 1 },
            VersionState::Committed,
        )
        .unwrap();
}

fn modify<R: Row>(stores: &mut [MvccStore], shard: usize, key: Key, change: impl FnOnce(&mut R)) {
    let mut value: R = row(stores, shard, &key);
    change(&mut value);
    corrupt(stores, shard, key, Some(value.encode()));
}

#[test]
fn a_small_load_has_its_cardinalities_and_is_consistent() {
    let (tpcc, stores) = small(2, 1);
    for (shard, store) in stores.iter().enumerate() {
        assert_eq!(count(store, WAREHOUSE), 1, "shard {shard}");
        assert_eq!(count(store, DISTRICT), 10);
        assert_eq!(count(store, CUSTOMER), 300);
        assert_eq!(count(store, HISTORY), 300);
        assert_eq!(count(store, ORDER), 300);
        assert_eq!(count(store, ORDER_CUST), 300);
        assert_eq!(count(store, NEW_ORDER), 90, "orders 22..=30 of 10 districts");
        assert_eq!(count(store, STOCK), 1_000);
        assert_eq!(count(store, ITEM), 1_000, "ITEM on every shard");
    }
    assert_eq!(
        stores[0].get_at(&item_key(7), Timestamp::MAX),
        stores[1].get_at(&item_key(7), Timestamp::MAX)
    );
    assert!(
        stores[0].get_at(&warehouse_key(2), Timestamp::MAX).is_none(),
        "warehouse 2 on shard 1"
    );
    assert_consistent(&tpcc, &stores);
    let cc11 = check_load_only(&tpcc.layout(), &refs(&stores));
    assert!(cc11.passed, "{cc11:?}");
    let loaded_again = loaded_stores(&tpcc, 2);
    assert_eq!(
        stores[1].latest_values().collect::<Vec<_>>(),
        loaded_again[1].latest_values().collect::<Vec<_>>(),
        "the load is deterministic"
    );
}

#[test]
fn a_spec_warehouse_has_the_specified_rows_and_initial_values() {
    let tpcc = Tpcc::new(&options(1, 1, SPEC)).unwrap();
    let stores = loaded_stores(&tpcc, 1);
    let store = &stores[0];
    assert_eq!(count(store, CUSTOMER), 30_000);
    assert_eq!(count(store, HISTORY), 30_000);
    assert_eq!(count(store, ORDER), 30_000);
    assert_eq!(count(store, NEW_ORDER), 9_000);
    assert_eq!(count(store, STOCK), 100_000);
    assert_eq!(count(store, ITEM), 100_000);
    let lines = count(store, ORDER_LINE);
    assert!((290_000..310_000).contains(&lines), "about 10 lines per order: {lines}");
    let warehouse: Warehouse = row(&stores, 0, &warehouse_key(1));
    assert_eq!(warehouse.ytd_cents, 30_000_000, "300,000.00");
    let district: District = row(&stores, 0, &district_key(1, 4));
    assert_eq!((district.ytd_cents, district.next_o_id), (3_000_000, 3_001));
    let customer: Customer = row(&stores, 0, &customer_key(1, 2, 1_500));
    assert_eq!((customer.balance_cents, customer.ytd_payment_cents), (-1_000, 1_000));
    assert!((300..=500).contains(&customer.data.len()) && customer.middle == "OE");
    let first: Customer = row(&stores, 0, &customer_key(1, 1, 1));
    assert_eq!(first.last, "BARBARBAR", "customers 1..=1000 take names 0..=999 in order");
    let bad_credit = (1..=3_000)
        .filter(|&c| row::<Customer>(&stores, 0, &customer_key(1, 1, c)).credit == "BC")
        .count();
    assert!((200..400).contains(&bad_credit), "10% BC: {bad_credit}");
    let delivered: Order = row(&stores, 0, &order_key(1, 1, 2_100));
    let pending: Order = row(&stores, 0, &order_key(1, 1, 2_101));
    assert!(delivered.carrier_id.is_some() && pending.carrier_id.is_none());
    assert_consistent(&tpcc, &stores);
    assert!(check_load_only(&tpcc.layout(), &refs(&stores)).passed);
}

fn new_order(w: u64, d: u64, c: u64, lines: &[(u64, u64, u64)]) -> TxnRequest {
    let lines = lines
        .iter()
        .map(|&(i_id, supply_w, quantity)| LineRequest { i_id, supply_w, quantity })
        .collect();
    TxnRequest {
        proc: PROC_NEW_ORDER,
        args: NewOrderArgs { w, d, c, entry_d: 99, lines }.to_args(),
    }
}

#[test]
fn new_order_takes_the_next_id_updates_stock_and_inserts_the_order() {
    let (tpcc, mut stores) = small(2, 1);
    let lines = [(1, 1, 3), (2, 1, 10), (3, 2, 5), (4, 1, 1), (5, 2, 2)];
    let stock_before: Vec<Stock> =
        lines.iter().map(|&(i, w, _)| row(&stores, (w - 1) as usize, &stock_key(w, i))).collect();
    let outcome = apply_serially(&tpcc, &mut stores, &new_order(1, 3, 7, &lines), 10);
    assert_eq!(outcome.result, TxnResult::Committed);
    assert_eq!(outcome.shards_touched, 3, "home piece, a piece on shard 1, the insert piece");
    let district: District = row(&stores, 0, &district_key(1, 3));
    assert_eq!(district.next_o_id, 32);
    let order: Order = row(&stores, 0, &order_key(1, 3, 31));
    assert_eq!((order.c_id, order.ol_cnt, order.all_local, order.carrier_id), (7, 5, false, None));
    assert!(stores[0].get_at(&new_order_key(1, 3, 31), Timestamp::MAX).is_some());
    assert!(stores[0].get_at(&order_cust_key(1, 3, 7, 31), Timestamp::MAX).is_some());
    for (n, (&(i, w, qty), before)) in lines.iter().zip(&stock_before).enumerate() {
        let after: Stock = row(&stores, (w - 1) as usize, &stock_key(w, i));
        let expected = if before.quantity >= qty as i64 + 10 {
            before.quantity - qty as i64
        } else {
            before.quantity - qty as i64 + 91
        };
        assert_eq!(after.quantity, expected, "line {n}");
        assert_eq!(
            (after.ytd, after.order_cnt, after.remote_cnt),
            (qty as i64, 1, u64::from(w != 1))
        );
        let line: OrderLine = row(&stores, 0, &order_line_key(1, 3, 31, n as u64 + 1));
        let item: Item = row(&stores, 0, &item_key(i));
        assert_eq!(line.amount_cents, item.price_cents * qty as i64);
        assert_eq!(line.dist_info, before.dist[2], "S_DIST_03 of the supplying stock");
        assert_eq!((line.delivery_d, line.supply_w_id), (None, w));
    }
    assert_consistent(&tpcc, &stores);
}

#[test]
fn a_new_order_with_an_unused_item_rolls_back_as_a_user_abort() {
    let (tpcc, mut stores) = small(1, 1);
    let before = stores[0].version_count();
    let txn = new_order(1, 1, 1, &[(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (1_001, 1, 1)]);
    let outcome = apply_serially(&tpcc, &mut stores, &txn, 10);
    let TxnResult::UserAborted(reason) = &outcome.result else { panic!("{outcome:?}") };
    assert!(reason.starts_with("rollback:"), "{reason}");
    assert_eq!(stores[0].version_count(), before, "nothing written");
    let mut check = tpcc.checker();
    check.observe(&completion(1, txn, outcome));
    let results = check.check(&refs(&stores));
    let aborts = results.iter().find(|r| r.name.contains("rollbacks")).unwrap();
    assert!(aborts.passed && aborts.detail.contains("1 rollbacks (100.00%"), "{aborts:?}");
}

fn payment(w: u64, d: u64, c_w: u64, c_d: u64, c: u64, amount_cents: i64, seq: u64) -> TxnRequest {
    let args = PaymentArgs { w, d, c_w, c_d, c, amount_cents, date: 50, origin: 1, seq };
    TxnRequest { proc: PROC_PAYMENT, args: args.to_args() }
}

#[test]
fn payment_moves_the_amount_to_the_warehouse_and_district_and_records_history() {
    let (tpcc, mut stores) = small(2, 1);
    let bc = (1..=30)
        .find(|&c| row::<Customer>(&stores, 1, &customer_key(2, 5, c)).credit == "BC")
        .unwrap_or(1);
    let before: Customer = row(&stores, 1, &customer_key(2, 5, bc));
    let outcome = apply_serially(&tpcc, &mut stores, &payment(1, 2, 2, 5, bc, 12_345, 77), 10);
    assert_eq!(outcome.result, TxnResult::Committed);
    assert_eq!(outcome.outputs[1], vec![Datum::Int(before.balance_cents - 12_345)]);
    let warehouse: Warehouse = row(&stores, 0, &warehouse_key(1));
    assert_eq!(warehouse.ytd_cents, SMALL.warehouse_ytd_cents() + 12_345);
    let district: District = row(&stores, 0, &district_key(1, 2));
    assert_eq!(district.ytd_cents, SMALL.district_ytd_cents() + 12_345);
    let customer: Customer = row(&stores, 1, &customer_key(2, 5, bc));
    assert_eq!(customer.ytd_payment_cents, before.ytd_payment_cents + 12_345);
    assert_eq!(customer.payment_cnt, 2);
    if customer.credit == "BC" {
        assert!(customer.data.starts_with(&format!("{bc} 5 2 2 1 123.45|")), "{}", customer.data);
        assert!(customer.data.len() <= 500);
    }
    let history: History = row(&stores, 0, &history_key(1, 2, 1, 77));
    assert_eq!(
        (history.c_w_id, history.c_d_id, history.c_id, history.amount_cents),
        (2, 5, bc, 12_345)
    );
    assert_eq!(history.data, format!("{}    {}", warehouse.name, district.name));
    assert_consistent(&tpcc, &stores);
}

#[test]
fn order_status_reports_the_customers_newest_order() {
    let (tpcc, mut stores) = small(1, 1);
    let lines = [(10, 1, 2), (11, 1, 2), (12, 1, 2), (13, 1, 2), (14, 1, 2), (15, 1, 2)];
    apply_serially(&tpcc, &mut stores, &new_order(1, 4, 9, &lines), 10);
    let status = TxnRequest {
        proc: PROC_ORDER_STATUS,
        args: vec![Datum::Uint(1), Datum::Uint(4), Datum::Uint(9)],
    };
    let outcome = apply_serially(&tpcc, &mut stores, &status, 11);
    let customer: Customer = row(&stores, 0, &customer_key(1, 4, 9));
    assert_eq!(outcome.outputs[0], vec![Datum::Int(customer.balance_cents), Datum::Uint(31)]);
    let sum: i64 = (1..=6)
        .map(|n| row::<OrderLine>(&stores, 0, &order_line_key(1, 4, 31, n)).amount_cents)
        .sum();
    assert_eq!(outcome.outputs[1], vec![Datum::Uint(0), Datum::Uint(6), Datum::Int(sum)]);
    assert_eq!(stores[0].versions(&customer_key(1, 4, 9)).len(), 1, "read-only");
}

#[test]
fn delivery_delivers_the_oldest_new_order_of_each_district_and_skips_empty_ones() {
    let (tpcc, mut stores) = small(1, 1);
    // District 6 has nothing to deliver.
    for o in SMALL.first_undelivered..=SMALL.orders() {
        corrupt(&mut stores, 0, new_order_key(1, 6, o), None);
        modify::<Order>(&mut stores, 0, order_key(1, 6, o), |order| order.carrier_id = Some(1));
        let count = row::<Order>(&stores, 0, &order_key(1, 6, o)).ol_cnt;
        for n in 1..=count {
            modify::<OrderLine>(&mut stores, 0, order_line_key(1, 6, o, n), |l| {
                l.delivery_d = Some(1)
            });
        }
    }
    let oldest = SMALL.first_undelivered;
    let order: Order = row(&stores, 0, &order_key(1, 2, oldest));
    let customer_before: Customer = row(&stores, 0, &customer_key(1, 2, order.c_id));
    let sum: i64 = (1..=order.ol_cnt)
        .map(|n| row::<OrderLine>(&stores, 0, &order_line_key(1, 2, oldest, n)).amount_cents)
        .sum();
    let txn = TxnRequest {
        proc: PROC_DELIVERY,
        args: vec![Datum::Uint(1), Datum::Uint(7), Datum::Uint(60)],
    };
    let outcome = apply_serially(&tpcc, &mut stores, &txn, 1 << 62);
    assert_eq!(outcome.outputs[2], vec![Datum::Uint(9)], "9 of 10 districts had an order");
    assert!(stores[0].get_at(&new_order_key(1, 2, oldest), Timestamp::MAX).is_none());
    assert!(stores[0].get_at(&new_order_key(1, 2, oldest + 1), Timestamp::MAX).is_some());
    let delivered: Order = row(&stores, 0, &order_key(1, 2, oldest));
    assert_eq!(delivered.carrier_id, Some(7));
    let line: OrderLine = row(&stores, 0, &order_line_key(1, 2, oldest, 1));
    assert_eq!(line.delivery_d, Some(60));
    let customer: Customer = row(&stores, 0, &customer_key(1, 2, order.c_id));
    assert_eq!(customer.balance_cents, customer_before.balance_cents + sum);
    assert_eq!(customer.delivery_cnt, customer_before.delivery_cnt + 1);
    // District 6 was emptied by hand, without crediting its customers: CC10, CC12 and the
    // delivery counts flag it, and only it; the real deliveries broke nothing.
    let results = check_database(&tpcc.layout(), &refs(&stores));
    let broken = failed(&results);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    for names in ["CC10", "CC12", "delivery counts"] {
        assert!(broken.iter().any(|b| b.contains(names)), "{broken:#?}");
    }
    assert!(broken.iter().all(|b| !b.contains("district 2 ")), "{broken:#?}");
}

#[test]
fn stock_level_counts_distinct_low_stock_items_of_the_last_twenty_orders() {
    let (tpcc, mut stores) = small(1, 1);
    let txn = TxnRequest {
        proc: PROC_STOCK_LEVEL,
        args: vec![Datum::Uint(1), Datum::Uint(8), Datum::Uint(20)],
    };
    let outcome = apply_serially(&tpcc, &mut stores, &txn, 10);
    let mut items = std::collections::BTreeSet::new();
    for o in (31 - STOCK_LEVEL_ORDERS)..31 {
        let order: Order = row(&stores, 0, &order_key(1, 8, o));
        for n in 1..=order.ol_cnt {
            items.insert(row::<OrderLine>(&stores, 0, &order_line_key(1, 8, o, n)).i_id);
        }
    }
    let low =
        items.iter().filter(|&&i| row::<Stock>(&stores, 0, &stock_key(1, i)).quantity < 20).count();
    assert!(low > 0, "the test needs some low stock");
    assert_eq!(outcome.outputs[2], vec![Datum::Uint(low as u64)]);
}

#[test]
fn a_long_serial_run_of_generated_transactions_stays_consistent() {
    let tpcc = Tpcc::new(&WorkloadOptions {
        shards: 2,
        tpcc: TpccOptions {
            warehouses_per_shard: 2,
            remote_item_percent: 20,
            remote_payment_percent: 40,
            scale: SMALL,
            ..TpccOptions::default()
        },
        ..WorkloadOptions::default()
    })
    .unwrap();
    let mut stores = loaded_stores(&tpcc, 2);
    let mut check = tpcc.checker();
    let mut generators: Vec<_> = (0..4).map(|c| tpcc.generator(c, 5)).collect();
    let (mut committed, mut rolled_back, mut cross) = (0, 0, 0);
    for request in 0..3_000u64 {
        let txn = generators[(request % 4) as usize].next(RequestId(request));
        let outcome = apply_serially(&tpcc, &mut stores, &txn, 10 + request);
        match &outcome.result {
            TxnResult::Committed => committed += 1,
            TxnResult::UserAborted(_) => rolled_back += 1,
            TxnResult::Failed(f) => panic!("{f:?}"),
        }
        let shards: std::collections::BTreeSet<u32> = tpcc
            .registry()
            .get(txn.proc)
            .unwrap()
            .plan(&txn.args, meridian_core::txn::PlanContext { partitioner: &tpcc.partitioner() })
            .unwrap()
            .iter()
            .filter_map(|p| match p.target {
                meridian_core::txn::ShardTarget::Shard(s) => Some(s.0),
                _ => None,
            })
            .collect();
        cross += u64::from(shards.len() > 1);
        check.observe(&completion(request, txn, outcome));
    }
    assert!(
        committed > 2_900 && rolled_back > 3,
        "{committed} committed, {rolled_back} rolled back"
    );
    assert!(cross > 300, "the remote knobs make cross-shard transactions: {cross}");
    let results = check.check(&refs(&stores));
    assert!(failed(&results).is_empty(), "{:#?}", failed(&results));
}

#[test]
fn the_generator_follows_the_mix_and_paper_compat_runs_new_order_only() {
    let tpcc = Tpcc::new(&options(4, 1, SMALL)).unwrap();
    let mut generator = tpcc.generator(0, 1);
    let mut kinds = [0u64; 5];
    let (mut lines, mut remote_lines, mut rollbacks, mut payments, mut remote_payments) =
        (0, 0, 0, 0, 0);
    for request in 0..40_000 {
        let txn = generator.next(RequestId(request));
        kinds[txn.proc.0 as usize] += 1;
        if txn.proc == PROC_NEW_ORDER {
            let items = txn.args[4].as_list().unwrap();
            for item in items {
                let fields = item.as_list().unwrap();
                lines += 1;
                remote_lines += u64::from(fields[1] != txn.args[0]);
                rollbacks += u64::from(fields[0].as_uint().unwrap() > SMALL.items);
            }
        } else if txn.proc == PROC_PAYMENT {
            payments += 1;
            remote_payments += u64::from(txn.args[2] != txn.args[0]);
        }
    }
    for (kind, &expected) in MIX_PERCENT.iter().enumerate() {
        let percent = kinds[kind] as f64 * 100.0 / 40_000.0;
        assert!((percent - expected as f64).abs() < 1.0, "{}: {percent}%", TXN_NAMES[kind]);
    }
    let remote = remote_lines as f64 * 100.0 / lines as f64;
    assert!((0.7..1.3).contains(&remote), "1% remote lines: {remote}");
    let remote = remote_payments as f64 * 100.0 / payments as f64;
    assert!((13.5..16.5).contains(&remote), "15% remote payments: {remote}");
    let rollback = rollbacks as f64 * 100.0 / kinds[0] as f64;
    assert!((0.7..1.3).contains(&rollback), "1% rollbacks: {rollback}");

    let paper = Tpcc::new(&WorkloadOptions {
        shards: 4,
        tpcc: TpccOptions { mode: Mode::PaperCompat, scale: SMALL, ..TpccOptions::default() },
        ..WorkloadOptions::default()
    })
    .unwrap();
    let mut generator = paper.generator(0, 1);
    for request in 0..5_000 {
        let txn = generator.next(RequestId(request));
        assert_eq!(txn.proc, PROC_NEW_ORDER);
        let last = txn.args[4].as_list().unwrap().last().unwrap().as_list().unwrap()[0].as_uint();
        assert!(last.unwrap() <= SMALL.items, "no rollback in paper-compat mode");
    }
}

#[test]
fn last_names_resolve_to_the_middle_customer_by_first_name() {
    let tpcc = Tpcc::new(&options(1, 1, SPEC)).unwrap();
    let stores = loaded_stores(&tpcc, 1);
    for last in [0u64, 371, 999] {
        let c = tpcc.names.resolve(1, 3, last).unwrap();
        let name = crate::tpcc_gen::last_name(last);
        let mut matches: Vec<(String, u64)> = (1..=3_000)
            .map(|c| (c, row::<Customer>(&stores, 0, &customer_key(1, 3, c))))
            .filter(|(_, row)| row.last == name)
            .map(|(c, row)| (row.first, c))
            .collect();
        matches.sort();
        assert_eq!(c, matches[(matches.len() - 1) / 2].1, "{name}: {matches:?}");
    }
}

/// A corruption and the condition that must catch it.
fn assert_catches(condition: &str, corrupt_it: impl FnOnce(&mut Vec<MvccStore>)) {
    let (tpcc, mut stores) = small(2, 1);
    corrupt_it(&mut stores);
    let results = check_database(&tpcc.layout(), &refs(&stores));
    let result = results.iter().find(|r| r.name.contains(condition)).expect(condition);
    assert!(!result.passed, "{condition} missed the corruption: {result:?}");
    assert!(result.detail.contains("warehouse"), "names where: {}", result.detail);
}

#[test]
fn each_consistency_condition_catches_a_corrupted_database() {
    assert_catches("CC1 ", |s| modify::<Warehouse>(s, 0, warehouse_key(1), |w| w.ytd_cents += 1));
    assert_catches("CC2 ", |s| modify::<District>(s, 1, district_key(2, 3), |d| d.next_o_id += 1));
    assert_catches("CC3 ", |s| corrupt(s, 0, new_order_key(1, 1, 25), None));
    assert_catches("CC4 ", |s| corrupt(s, 0, order_line_key(1, 1, 3, 1), None));
    assert_catches("CC5 ", |s| {
        modify::<Order>(s, 0, order_key(1, 1, 25), |o| o.carrier_id = Some(3))
    });
    assert_catches("CC6 ", |s| modify::<Order>(s, 0, order_key(1, 1, 5), |o| o.ol_cnt += 1));
    assert_catches("CC7 ", |s| {
        modify::<OrderLine>(s, 0, order_line_key(1, 1, 25, 1), |l| l.delivery_d = Some(4))
    });
    assert_catches("CC8 ", |s| {
        let history = History {
            c_id: 1,
            c_d_id: 1,
            c_w_id: 1,
            d_id: 1,
            w_id: 1,
            date: 2,
            amount_cents: 5,
            data: String::new(),
        };
        corrupt(s, 0, history_key(1, 1, 3, 3), Some(history.encode()));
    });
    assert_catches("CC9 ", |s| {
        modify::<District>(s, 0, district_key(1, 1), |d| d.ytd_cents += 7);
        modify::<District>(s, 0, district_key(1, 2), |d| d.ytd_cents -= 7);
    });
    assert_catches("CC10 ", |s| {
        modify::<Customer>(s, 1, customer_key(2, 4, 8), |c| c.balance_cents -= 1)
    });
    assert_catches("CC12 ", |s| {
        modify::<Customer>(s, 1, customer_key(2, 4, 8), |c| c.ytd_payment_cents += 1)
    });
    assert_catches("customer payment", |s| {
        modify::<Customer>(s, 0, customer_key(1, 1, 1), |c| c.payment_cnt += 1)
    });
    assert_catches("stock", |s| modify::<Stock>(s, 1, stock_key(2, 17), |st| st.ytd += 5));
    assert_catches("decode", |s| corrupt(s, 0, warehouse_key(1), Some(vec![0xFF; 4])));
    // CC11 holds only after load.
    let (tpcc, mut stores) = small(1, 1);
    corrupt(&mut stores, 0, new_order_key(1, 2, 30), None);
    let result = check_load_only(&tpcc.layout(), &refs(&stores));
    assert!(!result.passed && result.detail.contains("warehouse 1 district 2"), "{result:?}");
}

#[test]
fn bad_settings_are_refused_with_a_message() {
    let mut bad = options(2, 0, SMALL);
    assert!(Tpcc::new(&bad).unwrap_err().0.contains("at least one warehouse"));
    bad.tpcc.warehouses_per_shard = 1;
    bad.tpcc.remote_item_percent = 101;
    assert!(Tpcc::new(&bad).unwrap_err().0.contains("--remote-item-pct"));
    assert!(TpccOptions::from_flags(None, None, None, Some("fast"), None)
        .unwrap_err()
        .0
        .contains("paper-compat"));
    assert!(TpccOptions::from_flags(None, None, None, None, Some("huge")).is_err());
    let tpcc_flags_elsewhere = WorkloadOptions {
        tpcc: TpccOptions { warehouses_per_shard: 3, ..TpccOptions::default() },
        ..WorkloadOptions::default()
    };
    let error = crate::build("bank", &tpcc_flags_elsewhere).err().unwrap();
    assert!(error.0.contains("apply to tpcc"), "{error}");
    // Procedures refuse arguments outside the layout instead of touching other keys.
    let (tpcc, _) = small(1, 1);
    let registry = tpcc.registry();
    let partitioner = tpcc.partitioner();
    let context = meridian_core::txn::PlanContext { partitioner: &partitioner };
    let plan = |txn: &TxnRequest| registry.get(txn.proc).unwrap().plan(&txn.args, context);
    assert!(plan(&new_order(2, 1, 1, &[(1, 1, 1); 5])).is_err(), "warehouse 2 of 1");
    assert!(plan(&new_order(1, 11, 1, &[(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1)]))
        .is_err());
    assert!(
        plan(&new_order(1, 1, 1, &[(1, 1, 1), (1, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1)]))
            .is_err(),
        "a repeated line"
    );
    assert!(plan(&new_order(1, 1, 1, &[(1, 1, 1)])).is_err(), "too few lines");
    assert!(plan(&payment(1, 1, 1, 1, 1, 99, 1)).is_err(), "below 1.00");
}

/// Swarm seeds 83 and 110 of `tpcc` (small, 3 shards, faults): a rollback whose unused item was
/// supplied by another shard reached the client as that shard's "STOCK row is missing" (a
/// corrupt-row abort) when its stock piece answered before the home piece.
#[test]
fn seed_83_a_remote_rollback_line_is_reported_as_the_rollback() {
    let (tpcc, stores) = small(2, 1);
    let txn = new_order(1, 1, 1, &[(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (1_001, 2, 1)]);
    let registry = tpcc.registry();
    let procedure = registry.get(txn.proc).unwrap();
    let keys = procedure.keys(1, &txn.args, &[]).unwrap();
    assert_eq!(keys.reads, vec![stock_key(2, 1_001)]);
    let reads = meridian_core::txn::Reads {
        values: vec![stores[1].get_at(&keys.reads[0], Timestamp::MAX).map(Vec::as_slice)],
        scans: Vec::new(),
    };
    let abort = procedure.execute(1, &txn.args, &[], &reads).unwrap_err();
    assert!(abort.0.starts_with("rollback:"), "{abort:?}");
}
