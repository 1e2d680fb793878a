//! TPC-C's consistency conditions (§3.3.2) on the final stores, plus bookkeeping.
//!
//! After a run the clients have stopped and every transaction has finished, so the latest
//! committed versions are a consistent snapshot. Each condition is checked for every
//! warehouse, district, order, line or customer it concerns, and reported pass/fail with the
//! first violations: the condition, where (warehouse, district, ...) and the values found.
//!
//! - CC1 `W_YTD = Σ D_YTD`; CC2 `D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID)`; CC3 NEW-ORDER ids
//!   of a district have no gaps; CC4 `Σ O_OL_CNT = #ORDER-LINE` per district; CC5
//!   `O_CARRIER_ID` is NULL exactly for orders with a NEW-ORDER row; CC6 `O_OL_CNT = #lines`
//!   per order; CC7 `OL_DELIVERY_D` is NULL exactly when the order's carrier is; CC8 `W_YTD =
//!   Σ H_AMOUNT` of its HISTORY; CC9 the same per district; CC10 `C_BALANCE = Σ delivered
//!   OL_AMOUNT − Σ H_AMOUNT` of the customer; CC12 `C_BALANCE + C_YTD_PAYMENT = Σ delivered
//!   OL_AMOUNT`.
//! - CC11 (`#ORDER − #NEW-ORDER = 2,100` per district) holds only until the first Delivery:
//!   [`check_load_only`] checks it on a freshly loaded database.
//! - Bookkeeping (not in the spec): `C_PAYMENT_CNT` = the customer's HISTORY rows,
//!   `C_DELIVERY_CNT` = its orders delivered since load, and each stock row's `S_YTD`,
//!   `S_ORDER_CNT`, `S_REMOTE_CNT` = the quantities and counts of the lines ordered since load.
//! - Every row decodes; every user abort is a NewOrder rollback.

use super::procs::Layout;
use super::schema::*;
use super::{PROC_NEW_ORDER, TXN_NAMES};
use crate::{CheckResult, Completion, InvariantCheck};
use meridian_core::key::{Key, Value};
use meridian_core::txn::TxnResult;
use meridian_core::ShardId;
use meridian_storage::MvccStore;
use std::collections::{BTreeMap, BTreeSet};

/// Violations listed per condition; the rest are counted.
const VIOLATIONS_SHOWN_MAX: usize = 5;

/// One condition's tally.
struct Condition {
    name: &'static str,
    what: &'static str,
    checked: u64,
    violations: u64,
    shown: Vec<String>,
}

impl Condition {
    fn new(name: &'static str, what: &'static str) -> Self {
        Self { name, what, checked: 0, violations: 0, shown: Vec::new() }
    }

    fn expect(&mut self, holds: bool, found: impl FnOnce() -> String) {
        self.checked += 1;
        if !holds {
            self.violations += 1;
            if self.shown.len() < VIOLATIONS_SHOWN_MAX {
                self.shown.push(found());
            }
        }
    }

    /// Records a violation of something already counted as checked.
    fn fail(&mut self, found: impl FnOnce() -> String) {
        self.violations += 1;
        if self.shown.len() < VIOLATIONS_SHOWN_MAX {
            self.shown.push(found());
        }
    }

    fn result(self) -> CheckResult {
        let detail = if self.violations == 0 {
            format!("{} {} checked", self.checked, self.what)
        } else {
            format!(
                "{} of {} {} violate it: {}",
                self.violations,
                self.checked,
                self.what,
                self.shown.join("; ")
            )
        };
        CheckResult { name: self.name.to_string(), passed: self.violations == 0, detail }
    }
}

/// Where a row is, from its key: "warehouse W (ids ...)".
fn location(key: &Key) -> String {
    let mut reader = key.reader();
    let mut ids = Vec::new();
    while let Ok(id) = reader.u64() {
        ids.push(id);
    }
    match ids.split_first() {
        Some((w, rest)) => format!("warehouse {w} key ids {rest:?}"),
        None => format!("key {key:?}"),
    }
}

/// The latest rows of `table` across the stores, in key order per store.
fn rows<'a>(
    stores: &'a [(ShardId, &'a MvccStore)],
    table: u8,
) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
    let start = Key::table(table).build();
    let end = Key::table(table + 1).build();
    stores.iter().flat_map(move |(_, store)| {
        store.latest_range(&start, &end).filter_map(|(k, v)| v.value.as_ref().map(|v| (k, v)))
    })
}

#[derive(Default)]
struct OrderInfo {
    c: u64,
    carried: bool,
    ol_cnt: u64,
    lines: u64,
}

#[derive(Default)]
struct DistrictTally {
    ytd_cents: i64,
    next_o_id: u64,
    max_o: u64,
    ol_cnt_sum: u64,
    lines: u64,
    no_min: Option<u64>,
    no_max: u64,
    no_count: u64,
    history_cents: i64,
}

#[derive(Default)]
struct CustomerTally {
    delivered_cents: i64,
    history_cents: i64,
    history_rows: u64,
    delivered_orders_since_load: u64,
}

/// Checks CC1–CC10, CC12 and the bookkeeping on the latest state of `stores`.
pub fn check_database(layout: &Layout, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
    let mut audit = Audit::new(layout, stores);
    // Each table is read once, in this order: a later one checks against what the earlier
    // ones tallied (CC5 needs every NEW-ORDER row, CC6 and CC7 every ORDER, the sums every
    // row they add up).
    audit.read_warehouses();
    audit.read_districts();
    audit.read_new_orders();
    audit.read_orders();
    audit.read_order_lines();
    audit.read_history();
    audit.check_warehouses();
    audit.check_districts();
    audit.read_customers();
    audit.read_stock();
    audit.results()
}

/// What [`check_database`] tallies table by table, and the conditions it reports.
struct Audit<'a> {
    layout: &'a Layout,
    stores: &'a [(ShardId, &'a MvccStore)],
    decode: Condition,
    /// CC1–CC10 and CC12, in that order.
    cc: [Condition; 11],
    customer_counts: Condition,
    stock_counts: Condition,
    /// Per warehouse: W_YTD and the sum of its HISTORY amounts.
    warehouses: BTreeMap<u64, (i64, i64)>,
    districts: BTreeMap<(u64, u64), DistrictTally>,
    new_orders: BTreeSet<(u64, u64, u64)>,
    orders: BTreeMap<(u64, u64, u64), OrderInfo>,
    customers: BTreeMap<(u64, u64, u64), CustomerTally>,
    /// Per (supply warehouse, item): quantity, lines and remote lines ordered since load.
    stock_sums: BTreeMap<(u64, u64), (i64, u64, u64)>,
}

impl<'a> Audit<'a> {
    fn new(layout: &'a Layout, stores: &'a [(ShardId, &'a MvccStore)]) -> Self {
        Self {
            layout,
            stores,
            decode: Condition::new("tpcc rows decode", "rows"),
            cc: [
                Condition::new("tpcc CC1 W_YTD = sum D_YTD", "warehouses"),
                Condition::new("tpcc CC2 D_NEXT_O_ID-1 = max O_ID = max NO_O_ID", "districts"),
                Condition::new("tpcc CC3 NEW-ORDER ids have no gaps", "districts"),
                Condition::new("tpcc CC4 sum O_OL_CNT = ORDER-LINE rows", "districts"),
                Condition::new("tpcc CC5 O_CARRIER_ID null iff NEW-ORDER row", "orders"),
                Condition::new("tpcc CC6 O_OL_CNT = lines of the order", "orders"),
                Condition::new("tpcc CC7 OL_DELIVERY_D null iff O_CARRIER_ID null", "order lines"),
                Condition::new("tpcc CC8 W_YTD = sum H_AMOUNT", "warehouses"),
                Condition::new("tpcc CC9 D_YTD = sum H_AMOUNT", "districts"),
                Condition::new("tpcc CC10 C_BALANCE = delivered OL_AMOUNT - H_AMOUNT", "customers"),
                Condition::new(
                    "tpcc CC12 C_BALANCE + C_YTD_PAYMENT = delivered OL_AMOUNT",
                    "customers",
                ),
            ],
            customer_counts: Condition::new(
                "tpcc customer payment and delivery counts",
                "customers",
            ),
            stock_counts: Condition::new(
                "tpcc stock S_YTD, S_ORDER_CNT, S_REMOTE_CNT",
                "stock rows",
            ),
            warehouses: BTreeMap::new(),
            districts: BTreeMap::new(),
            new_orders: BTreeSet::new(),
            orders: BTreeMap::new(),
            customers: BTreeMap::new(),
            stock_sums: BTreeMap::new(),
        }
    }

    /// Every condition's result: decoding first, then CC1–CC12, then the bookkeeping.
    fn results(self) -> Vec<CheckResult> {
        let mut results = vec![self.decode.result()];
        results.extend(self.cc.into_iter().map(Condition::result));
        results.push(self.customer_counts.result());
        results.push(self.stock_counts.result());
        results
    }

    /// Each warehouse's W_YTD.
    fn read_warehouses(&mut self) {
        for (key, value) in rows(self.stores, WAREHOUSE) {
            self.decode.checked += 1;
            match (key_ids::<1>(key), Warehouse::decode(Some(value))) {
                (Some([w]), Ok(row)) => {
                    self.warehouses.insert(w, (row.ytd_cents, 0));
                }
                (_, error) => self
                    .decode
                    .fail(|| format!("WAREHOUSE of {}: {:?}", location(key), error.err())),
            }
        }
    }

    /// Each district's D_YTD and D_NEXT_O_ID.
    fn read_districts(&mut self) {
        for (key, value) in rows(self.stores, DISTRICT) {
            self.decode.checked += 1;
            match (key_ids::<2>(key), District::decode(Some(value))) {
                (Some([w, d]), Ok(row)) => {
                    let tally = self.districts.entry((w, d)).or_default();
                    tally.ytd_cents = row.ytd_cents;
                    tally.next_o_id = row.next_o_id;
                }
                (_, error) => {
                    self.decode.fail(|| format!("DISTRICT of {}: {:?}", location(key), error.err()))
                }
            }
        }
    }

    /// The NEW-ORDER rows, and each district's lowest, highest and count of them.
    fn read_new_orders(&mut self) {
        for (key, _) in rows(self.stores, NEW_ORDER) {
            self.decode.checked += 1;
            let Some([w, d, o]) = key_ids::<3>(key) else {
                self.decode.fail(|| format!("NEW-ORDER key of {}", location(key)));
                continue;
            };
            self.new_orders.insert((w, d, o));
            let tally = self.districts.entry((w, d)).or_default();
            tally.no_min = Some(tally.no_min.map_or(o, |m| m.min(o)));
            tally.no_max = tally.no_max.max(o);
            tally.no_count += 1;
        }
    }

    /// CC5 per order (then per NEW-ORDER row without an order); tallies the orders, each
    /// district's highest order and O_OL_CNT sum, and each customer's deliveries since load.
    fn read_orders(&mut self) {
        for (key, value) in rows(self.stores, ORDER) {
            self.decode.checked += 1;
            let (Some([w, d, o]), Ok(row)) = (key_ids::<3>(key), Order::decode(Some(value))) else {
                self.decode.fail(|| format!("ORDER of {} does not decode", location(key)));
                continue;
            };
            let tally = self.districts.entry((w, d)).or_default();
            tally.max_o = tally.max_o.max(o);
            tally.ol_cnt_sum += row.ol_cnt;
            if row.carrier_id.is_some() && o >= self.layout.scale.first_undelivered {
                self.customers.entry((w, d, row.c_id)).or_default().delivered_orders_since_load +=
                    1;
            }
            let carried = row.carrier_id.is_some();
            let new_orders = &self.new_orders;
            self.cc[4].expect(carried != new_orders.contains(&(w, d, o)), || {
                format!(
                    "warehouse {w} district {d} order {o}: O_CARRIER_ID {:?}, NEW-ORDER row {}",
                    row.carrier_id,
                    if new_orders.contains(&(w, d, o)) { "present" } else { "absent" }
                )
            });
            self.orders.insert(
                (w, d, o),
                OrderInfo { c: row.c_id, carried, ol_cnt: row.ol_cnt, lines: 0 },
            );
        }
        for &(w, d, o) in &self.new_orders {
            if !self.orders.contains_key(&(w, d, o)) {
                self.cc[4].expect(false, || {
                    format!("warehouse {w} district {d}: NEW-ORDER {o} has no ORDER")
                });
            }
        }
    }

    /// CC7 per line and CC6 per order; tallies each district's lines, each customer's
    /// delivered amounts and each stock row's sums of the lines ordered since load.
    fn read_order_lines(&mut self) {
        let first_run_order = self.layout.scale.orders() + 1;
        for (key, value) in rows(self.stores, ORDER_LINE) {
            self.decode.checked += 1;
            let (Some([w, d, o, n]), Ok(line)) =
                (key_ids::<4>(key), OrderLine::decode(Some(value)))
            else {
                self.decode.fail(|| format!("ORDER-LINE of {} does not decode", location(key)));
                continue;
            };
            self.districts.entry((w, d)).or_default().lines += 1;
            let Some(order) = self.orders.get_mut(&(w, d, o)) else {
                self.cc[5].expect(false, || {
                    format!("warehouse {w} district {d}: line {n} of missing order {o}")
                });
                continue;
            };
            order.lines += 1;
            self.cc[6].expect(line.delivery_d.is_some() == order.carried, || {
                format!(
                    "warehouse {w} district {d} order {o} line {n}: OL_DELIVERY_D {:?}, carrier {}",
                    line.delivery_d,
                    if order.carried { "set" } else { "NULL" }
                )
            });
            if line.delivery_d.is_some() {
                self.customers.entry((w, d, order.c)).or_default().delivered_cents +=
                    line.amount_cents;
            }
            if o >= first_run_order {
                let sums = self.stock_sums.entry((line.supply_w_id, line.i_id)).or_default();
                sums.0 += line.quantity as i64;
                sums.1 += 1;
                sums.2 += u64::from(line.supply_w_id != w);
            }
        }
        for (&(w, d, o), order) in &self.orders {
            self.cc[5].expect(order.ol_cnt == order.lines, || {
                format!(
                    "warehouse {w} district {d} order {o}: O_OL_CNT {}, lines {}",
                    order.ol_cnt, order.lines
                )
            });
        }
    }

    /// The HISTORY amounts per warehouse, district and customer.
    fn read_history(&mut self) {
        for (key, value) in rows(self.stores, HISTORY) {
            self.decode.checked += 1;
            let Ok(row) = History::decode(Some(value)) else {
                self.decode.fail(|| format!("HISTORY of {} does not decode", location(key)));
                continue;
            };
            self.warehouses.entry(row.w_id).or_insert((0, 0)).1 += row.amount_cents;
            self.districts.entry((row.w_id, row.d_id)).or_default().history_cents +=
                row.amount_cents;
            let customer = self.customers.entry((row.c_w_id, row.c_d_id, row.c_id)).or_default();
            customer.history_cents += row.amount_cents;
            customer.history_rows += 1;
        }
    }

    /// CC1 and CC8 per warehouse.
    fn check_warehouses(&mut self) {
        for (&w, &(ytd, history)) in &self.warehouses {
            let sum: i64 = self.districts.range((w, 0)..(w + 1, 0)).map(|(_, t)| t.ytd_cents).sum();
            self.cc[0]
                .expect(ytd == sum, || format!("warehouse {w}: W_YTD {ytd}, sum D_YTD {sum}"));
            self.cc[7].expect(ytd == history, || {
                format!("warehouse {w}: W_YTD {ytd}, sum H_AMOUNT {history}")
            });
        }
    }

    /// CC2, CC3, CC4 and CC9 per district.
    fn check_districts(&mut self) {
        for (&(w, d), t) in &self.districts {
            self.cc[1].expect(
                t.next_o_id == t.max_o + 1 && (t.no_count == 0 || t.no_max == t.max_o),
                || {
                    format!(
                        "warehouse {w} district {d}: D_NEXT_O_ID {}, max O_ID {}, max NO_O_ID {}",
                        t.next_o_id, t.max_o, t.no_max
                    )
                },
            );
            let min = t.no_min.unwrap_or(0);
            self.cc[2].expect(t.no_count == 0 || t.no_max - min + 1 == t.no_count, || {
                format!(
                    "warehouse {w} district {d}: NEW-ORDER {min}..={} holds {} rows",
                    t.no_max, t.no_count
                )
            });
            self.cc[3].expect(t.ol_cnt_sum == t.lines, || {
                format!(
                    "warehouse {w} district {d}: sum O_OL_CNT {}, ORDER-LINE rows {}",
                    t.ol_cnt_sum, t.lines
                )
            });
            self.cc[8].expect(t.ytd_cents == t.history_cents, || {
                format!(
                    "warehouse {w} district {d}: D_YTD {}, sum H_AMOUNT {}",
                    t.ytd_cents, t.history_cents
                )
            });
        }
    }

    /// CC10, CC12 and the payment and delivery counts per customer (then per customer
    /// tallied but missing).
    fn read_customers(&mut self) {
        let mut customers = std::mem::take(&mut self.customers);
        for (key, value) in rows(self.stores, CUSTOMER) {
            self.decode.checked += 1;
            let (Some([w, d, c]), Ok(row)) = (key_ids::<3>(key), Customer::decode(Some(value)))
            else {
                self.decode.fail(|| format!("CUSTOMER of {} does not decode", location(key)));
                continue;
            };
            let t = customers.remove(&(w, d, c)).unwrap_or_default();
            self.cc[9].expect(row.balance_cents == t.delivered_cents - t.history_cents, || {
                format!(
                    "warehouse {w} district {d} customer {c}: C_BALANCE {}, delivered {} - history {}",
                    row.balance_cents, t.delivered_cents, t.history_cents
                )
            });
            self.cc[10].expect(row.balance_cents + row.ytd_payment_cents == t.delivered_cents, || {
                format!(
                    "warehouse {w} district {d} customer {c}: C_BALANCE {} + C_YTD_PAYMENT {}, delivered {}",
                    row.balance_cents, row.ytd_payment_cents, t.delivered_cents
                )
            });
            self.customer_counts.expect(
                u64::from(row.payment_cnt) == t.history_rows
                    && u64::from(row.delivery_cnt) == t.delivered_orders_since_load,
                || {
                    format!(
                        "warehouse {w} district {d} customer {c}: C_PAYMENT_CNT {} with {} HISTORY rows, C_DELIVERY_CNT {} with {} deliveries",
                        row.payment_cnt, t.history_rows, row.delivery_cnt, t.delivered_orders_since_load
                    )
                },
            );
        }
        for ((w, d, c), t) in customers {
            self.customer_counts.expect(false, || {
                format!(
                    "warehouse {w} district {d}: customer {c} is missing but has {} HISTORY rows",
                    t.history_rows
                )
            });
        }
    }

    /// S_YTD, S_ORDER_CNT and S_REMOTE_CNT per stock row (then per item ordered without
    /// one).
    fn read_stock(&mut self) {
        let mut stock_sums = std::mem::take(&mut self.stock_sums);
        for (key, value) in rows(self.stores, STOCK) {
            self.decode.checked += 1;
            let (Some([w, i]), Ok(row)) = (key_ids::<2>(key), Stock::decode(Some(value))) else {
                self.decode.fail(|| format!("STOCK of {} does not decode", location(key)));
                continue;
            };
            let (ytd, count, remote) = stock_sums.remove(&(w, i)).unwrap_or_default();
            self.stock_counts.expect(
                row.ytd == ytd && row.order_cnt == count && row.remote_cnt == remote,
                || {
                    format!(
                        "warehouse {w} item {i}: S_YTD {} S_ORDER_CNT {} S_REMOTE_CNT {}, lines since load {ytd} {count} {remote}",
                        row.ytd, row.order_cnt, row.remote_cnt
                    )
                },
            );
        }
        for ((w, i), _) in stock_sums {
            self.stock_counts.expect(false, || {
                format!("warehouse {w}: lines order item {i}, which has no stock row")
            });
        }
    }
}

/// CC11: `#ORDER − #NEW-ORDER` per district equals the orders loaded delivered. Holds right
/// after load only (the first Delivery changes it).
pub fn check_load_only(layout: &Layout, stores: &[(ShardId, &MvccStore)]) -> CheckResult {
    let mut condition =
        Condition::new("tpcc CC11 orders - new-orders = loaded delivered", "districts");
    let mut counts: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for (key, _) in rows(stores, ORDER) {
        if let Some([w, d, _]) = key_ids::<3>(key) {
            counts.entry((w, d)).or_default().0 += 1;
        }
    }
    for (key, _) in rows(stores, NEW_ORDER) {
        if let Some([w, d, _]) = key_ids::<3>(key) {
            counts.entry((w, d)).or_default().1 += 1;
        }
    }
    let expected = layout.scale.first_undelivered - 1;
    for ((w, d), (orders, new_orders)) in counts {
        condition.expect(orders.checked_sub(new_orders) == Some(expected), || {
            format!("warehouse {w} district {d}: {orders} orders - {new_orders} new-orders, expected {expected}")
        });
    }
    condition.result()
}

/// The run's checker: the database conditions plus what the clients saw.
pub struct TpccCheck {
    layout: Layout,
    committed: [u64; 5],
    rollbacks: u64,
    unexpected_aborts: Vec<String>,
    unexpected_abort_count: u64,
}

impl TpccCheck {
    /// A fresh checker.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            committed: [0; 5],
            rollbacks: 0,
            unexpected_aborts: Vec::new(),
            unexpected_abort_count: 0,
        }
    }
}

impl InvariantCheck for TpccCheck {
    fn observe(&mut self, completion: &Completion) {
        let proc = completion.txn.proc.0 as usize;
        match &completion.outcome.result {
            TxnResult::Committed => {
                if let Some(count) = self.committed.get_mut(proc) {
                    *count += 1;
                }
            }
            TxnResult::UserAborted(reason)
                if completion.txn.proc == PROC_NEW_ORDER && reason.starts_with("rollback:") =>
            {
                self.rollbacks += 1;
            }
            TxnResult::UserAborted(reason) => {
                self.unexpected_abort_count += 1;
                if self.unexpected_aborts.len() < VIOLATIONS_SHOWN_MAX {
                    let name = TXN_NAMES.get(proc).copied().unwrap_or("unknown");
                    self.unexpected_aborts.push(format!("{name}: {reason}"));
                }
            }
            TxnResult::Failed(_) => {}
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut results = check_database(&self.layout, stores);
        let new_orders = self.committed[0] + self.rollbacks;
        let mix = TXN_NAMES
            .iter()
            .zip(self.committed)
            .map(|(name, count)| format!("{name} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        let rollback_percent =
            if new_orders == 0 { 0.0 } else { 100.0 * self.rollbacks as f64 / new_orders as f64 };
        results.push(CheckResult {
            name: "tpcc user aborts are NewOrder rollbacks".into(),
            passed: self.unexpected_abort_count == 0,
            detail: if self.unexpected_abort_count == 0 {
                format!(
                    "committed {mix}; {} rollbacks ({rollback_percent:.2}% of new-orders)",
                    self.rollbacks
                )
            } else {
                format!(
                    "{} other user aborts: {}",
                    self.unexpected_abort_count,
                    self.unexpected_aborts.join("; ")
                )
            },
        });
        results
    }
}
