//! The TPC-C population (§4.3.3.1), bulk-loaded straight into the stores, and the static
//! customer last-name index the generators resolve names with.
//!
//! Every row comes from a random stream named by its table and warehouse (and district), all
//! seeded from [`LOAD_SEED`], so the data of a warehouse is the same whatever shard holds it
//! and however many shards there are. ITEM is the same on every shard.
//!
//! Initial values make every consistency condition hold right after the load: each customer
//! has one HISTORY row of 10.00 and a balance of -10.00, so `D_YTD = customers × 10.00` and
//! `W_YTD = districts × D_YTD` (300,000.00 at spec scale).

use super::schema::*;
use crate::tpcc_gen::{
    a_string, data_field, load_last_number, n_string, permutation, rand_range, zip,
    NURAND_CONSTANTS,
};
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_storage::MvccStore;

/// Seed of the population: the load is the same in every run and every process.
pub const LOAD_SEED: u64 = 0x7470_6363; // "tpcc"
/// O_ENTRY_D, H_DATE, C_SINCE and OL_DELIVERY_D of loaded rows. Run-time dates are request
/// ids plus [`RUN_DATE_BASE`], so they never equal it.
pub const LOAD_DATE: u64 = 1;
/// Run-time dates start above the load date.
pub const RUN_DATE_BASE: u64 = 2;
/// Opening balance of every customer, cents (-10.00).
pub const CUSTOMER_BALANCE_CENTS: i64 = -1_000;
/// The one HISTORY row per customer, cents (10.00).
pub const HISTORY_AMOUNT_CENTS: i64 = 1_000;
/// C_CREDIT_LIM, cents (50,000.00).
pub const CREDIT_LIMIT_CENTS: i64 = 5_000_000;

/// Table sizes per warehouse and district.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Districts per warehouse.
    pub districts: u64,
    /// Customers per district (and orders per district at load: one each).
    pub customers: u64,
    /// Items (and stock rows per warehouse).
    pub items: u64,
    /// The first order id loaded undelivered (with a NEW-ORDER row, no carrier).
    pub first_undelivered: u64,
}

/// The specification's sizes: 10 districts, 3,000 customers and orders per district, 100,000
/// items, orders 2,101..=3,000 undelivered.
pub const SPEC: Scale =
    Scale { districts: 10, customers: 3_000, items: 100_000, first_undelivered: 2_101 };

/// A hundredth of the customers and items, same shape (orders 22..=30 undelivered): for the
/// simulator's swarms, where a spec load per seed would dwarf 200 transactions.
pub const SMALL: Scale =
    Scale { districts: 10, customers: 30, items: 1_000, first_undelivered: 22 };

const _: () = {
    assert!(SPEC.first_undelivered > 1 && SPEC.first_undelivered <= SPEC.customers);
    assert!(SMALL.first_undelivered > 1 && SMALL.first_undelivered <= SMALL.customers);
    // Customers 1..=1000 take the last names 0..999 in order; a smaller district must still
    // hold only names a run can draw (see `LastNames::resolve`).
    assert!(SMALL.customers <= 1_000);
};

impl Scale {
    /// Orders per district at load: one per customer (O_C_ID is a permutation).
    pub fn orders(&self) -> u64 {
        self.customers
    }

    /// D_YTD at load, cents.
    pub fn district_ytd_cents(&self) -> i64 {
        self.customers as i64 * HISTORY_AMOUNT_CENTS
    }

    /// W_YTD at load, cents.
    pub fn warehouse_ytd_cents(&self) -> i64 {
        self.districts as i64 * self.district_ytd_cents()
    }
}

fn stream(table: &str, w: u64, d: u64) -> Rng {
    child_rng(LOAD_SEED, table, (w << 16) | d)
}

fn address(rng: &mut Rng) -> Address {
    Address {
        street_1: a_string(rng, 10, 20),
        street_2: a_string(rng, 10, 20),
        city: a_string(rng, 10, 20),
        state: a_string(rng, 2, 2),
        zip: zip(rng),
    }
}

/// First and last-name number of every customer of a district, in id order. The loader and
/// the last-name index both take them from here.
fn names(scale: &Scale, w: u64, d: u64) -> Vec<(String, u64)> {
    let mut rng = stream("tpcc-names", w, d);
    (1..=scale.customers)
        .map(|c| {
            let last = load_last_number(&mut rng, c, &NURAND_CONSTANTS);
            (a_string(&mut rng, 8, 16), last)
        })
        .collect()
}

/// Loads ITEM (every shard holds all of it).
pub fn load_items(scale: &Scale, store: &mut MvccStore) {
    let mut rng = stream("tpcc-item", 0, 0);
    for i in 1..=scale.items {
        let item = Item {
            im_id: rand_range(&mut rng, 1, 10_000),
            name: a_string(&mut rng, 14, 24),
            price_cents: rand_range(&mut rng, 100, 10_000) as i64,
            data: data_field(&mut rng),
        };
        store.load(item_key(i), item.encode());
    }
}

/// Loads every table of warehouse `w` but ITEM.
pub fn load_warehouse(scale: &Scale, w: u64, store: &mut MvccStore) {
    let mut rng = stream("tpcc-warehouse", w, 0);
    let warehouse = Warehouse {
        name: a_string(&mut rng, 6, 10),
        address: address(&mut rng),
        tax: rand_range(&mut rng, 0, 2_000) as u32,
        ytd_cents: scale.warehouse_ytd_cents(),
    };
    store.load(warehouse_key(w), warehouse.encode());
    let mut rng = stream("tpcc-stock", w, 0);
    for i in 1..=scale.items {
        let stock = Stock {
            quantity: rand_range(&mut rng, 10, 100) as i64,
            dist: (0..10).map(|_| a_string(&mut rng, 24, 24)).collect(),
            ytd: 0,
            order_cnt: 0,
            remote_cnt: 0,
            data: data_field(&mut rng),
        };
        store.load(stock_key(w, i), stock.encode());
    }
    for d in 1..=scale.districts {
        load_district(scale, w, d, store);
    }
}

fn load_district(scale: &Scale, w: u64, d: u64, store: &mut MvccStore) {
    let mut rng = stream("tpcc-district", w, d);
    let district = District {
        name: a_string(&mut rng, 6, 10),
        address: address(&mut rng),
        tax: rand_range(&mut rng, 0, 2_000) as u32,
        ytd_cents: scale.district_ytd_cents(),
        next_o_id: scale.orders() + 1,
    };
    store.load(district_key(w, d), district.encode());
    let mut rng = stream("tpcc-customer", w, d);
    for (index, (first, last)) in names(scale, w, d).into_iter().enumerate() {
        let c = index as u64 + 1;
        let customer = Customer {
            first,
            middle: "OE".into(),
            last: crate::tpcc_gen::last_name(last),
            address: address(&mut rng),
            phone: n_string(&mut rng, 16, 16),
            since: LOAD_DATE,
            credit: if uniform_u64(&mut rng, 10) == 0 { "BC" } else { "GC" }.into(),
            credit_lim_cents: CREDIT_LIMIT_CENTS,
            discount: rand_range(&mut rng, 0, 5_000) as u32,
            balance_cents: CUSTOMER_BALANCE_CENTS,
            ytd_payment_cents: HISTORY_AMOUNT_CENTS,
            payment_cnt: 1,
            delivery_cnt: 0,
            data: a_string(&mut rng, 300, 500),
        };
        store.load(customer_key(w, d, c), customer.encode());
        let history = History {
            c_id: c,
            c_d_id: d,
            c_w_id: w,
            d_id: d,
            w_id: w,
            date: LOAD_DATE,
            amount_cents: HISTORY_AMOUNT_CENTS,
            data: a_string(&mut rng, 12, 24),
        };
        store.load(history_key(w, d, 0, c), history.encode());
    }
    let mut rng = stream("tpcc-order", w, d);
    let customers = permutation(&mut rng, scale.orders());
    for (index, c) in customers.into_iter().enumerate() {
        let o = index as u64 + 1;
        let delivered = o < scale.first_undelivered;
        let order = Order {
            c_id: c,
            entry_d: LOAD_DATE,
            carrier_id: delivered.then(|| rand_range(&mut rng, 1, 10)),
            ol_cnt: rand_range(&mut rng, 5, 15),
            all_local: true,
        };
        for number in 1..=order.ol_cnt {
            let line = OrderLine {
                i_id: rand_range(&mut rng, 1, scale.items),
                supply_w_id: w,
                delivery_d: delivered.then_some(LOAD_DATE),
                quantity: 5,
                amount_cents: if delivered { 0 } else { rand_range(&mut rng, 1, 999_999) as i64 },
                dist_info: a_string(&mut rng, 24, 24),
            };
            store.load(order_line_key(w, d, o, number), line.encode());
        }
        store.load(order_key(w, d, o), order.encode());
        store.load(order_cust_key(w, d, c, o), Vec::new());
        if !delivered {
            store.load(new_order_key(w, d, o), Vec::new());
        }
    }
}

/// Customers by last name: per district, per last-name number, the ids sorted by C_FIRST.
/// Names never change after load, so the index is static and every client holds a copy.
#[derive(Debug)]
pub struct LastNames {
    districts: u64,
    customers: u64,
    /// `by_district[(w - 1) * districts + (d - 1)][last]`.
    by_district: Vec<Vec<Vec<u32>>>,
}

impl LastNames {
    /// Builds the index of `warehouses` warehouses.
    pub fn build(scale: &Scale, warehouses: u64) -> Self {
        let mut by_district = Vec::with_capacity((warehouses * scale.districts) as usize);
        for w in 1..=warehouses {
            for d in 1..=scale.districts {
                let mut index: Vec<Vec<(String, u32)>> = vec![Vec::new(); 1_000];
                for (c, (first, last)) in names(scale, w, d).into_iter().enumerate() {
                    index[last as usize].push((first, c as u32 + 1));
                }
                by_district.push(
                    index
                        .into_iter()
                        .map(|mut ids| {
                            ids.sort();
                            ids.into_iter().map(|(_, c)| c).collect()
                        })
                        .collect(),
                );
            }
        }
        Self { districts: scale.districts, customers: scale.customers, by_district }
    }

    /// The customer a transaction selecting last name number `last` in `(w, d)` takes: the
    /// one at position ⌈n/2⌉ of the n matches sorted by first name (§2.5.2.2). At small
    /// scale, where only the names `0..customers` exist, `last` wraps onto them.
    pub fn resolve(&self, w: u64, d: u64, last: u64) -> Option<u64> {
        let last = if self.customers < 1_000 { last % self.customers } else { last };
        let district = self.by_district.get(((w - 1) * self.districts + (d - 1)) as usize)?;
        let ids = district.get(last as usize)?;
        (!ids.is_empty()).then(|| u64::from(ids[(ids.len() - 1) / 2]))
    }
}
