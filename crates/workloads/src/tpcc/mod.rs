//! `tpcc`: TPC-C (revision 5.11) on the key-value store, in spec mode or paper-compat mode.
//!
//! - **spec**: the five transactions with the 45/43/4/4/4 mix, NURand with BenchBase's
//!   constants, 1% remote order lines, 15% remote payments, 60% of Payment and OrderStatus
//!   customers chosen by last name, 1% of NewOrders rolled back as a user abort (never
//!   retried), money in cents. After every run the consistency conditions CC1–CC10 and CC12
//!   are checked on the final stores, with stock and customer bookkeeping (module [`check`]).
//! - **paper-compat**: NewOrder only and no rollback, as the Janus and Mako configurations ran
//!   it, for comparison with published numbers. The same checks run.
//!
//! Warehouses `1..=shards × warehouses_per_shard` sit in consecutive blocks per shard; ITEM is
//! on every shard. Each transaction picks its home warehouse uniformly (as go-tpc does) and a
//! random district. A remote line or payment picks a uniformly random *other* warehouse, which
//! may share the home's shard when shards hold several: the report's measured cross-shard
//! fraction says what the knobs produced. The lines of one order are distinct by (item,
//! supplying warehouse): a repeat is drawn again (so the stock row is updated once per line).
//!
//! Deviations from the specification, all deliberate: no terminals, keying or think times
//! (closed loop, as research systems run it); dates are logical (load date 1, run dates from
//! request ids); OrderStatus finds a customer's newest order through an ORDER_CUST index that
//! NewOrder maintains; the last-name index is built at load and held by the clients (names
//! never change, so it is exact); CC11 holds only right after load and is checked there, in
//! the tests, not after a run.

pub mod check;
pub mod load;
pub mod procs;
pub mod schema;
#[cfg(test)]
mod tests;

use crate::tpcc_gen::{customer_id, item_id, rand_range, run_last_number, NURAND_CONSTANTS};
use crate::{InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use load::{LastNames, Scale, RUN_DATE_BASE};
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{Datum, PartitionRule, Partitioner, ProcId, Registry, TxnRequest};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use procs::{Layout, LineRequest, NewOrderArgs, PaymentArgs};
use std::sync::Arc;

/// NewOrder's procedure id.
pub const PROC_NEW_ORDER: ProcId = ProcId(0);
/// Payment's.
pub const PROC_PAYMENT: ProcId = ProcId(1);
/// OrderStatus's.
pub const PROC_ORDER_STATUS: ProcId = ProcId(2);
/// Delivery's.
pub const PROC_DELIVERY: ProcId = ProcId(3);
/// StockLevel's.
pub const PROC_STOCK_LEVEL: ProcId = ProcId(4);
/// Names of the procedures, by id.
pub const TXN_NAMES: [&str; 5] =
    ["new-order", "payment", "order-status", "delivery", "stock-level"];
/// The spec mix in percent, by procedure id.
pub const MIX_PERCENT: [u64; 5] = [45, 43, 4, 4, 4];
const _: () = assert!(
    MIX_PERCENT[0] + MIX_PERCENT[1] + MIX_PERCENT[2] + MIX_PERCENT[3] + MIX_PERCENT[4] == 100
);

/// Percent of NewOrders rolled back (spec mode).
pub const ROLLBACK_PERCENT: u64 = 1;
/// Percent of Payment and OrderStatus customers chosen by last name.
pub const BY_LAST_NAME_PERCENT: u64 = 60;
/// Most warehouses one run may have (the last-name index and the load grow with them).
pub const WAREHOUSES_MAX: u64 = 10_000;

/// Spec or paper-compat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The full mix with rollbacks.
    Spec,
    /// NewOrder only, no rollback.
    PaperCompat,
}

/// TPC-C's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpccOptions {
    /// Warehouses on each shard (at least 1).
    pub warehouses_per_shard: u64,
    /// Percent of order lines supplied by another warehouse (spec: 1).
    pub remote_item_percent: u64,
    /// Percent of payments for a customer of another warehouse (spec: 15).
    pub remote_payment_percent: u64,
    /// Spec or paper-compat.
    pub mode: Mode,
    /// Table sizes: the spec's, or `load::SMALL` for simulation swarms.
    pub scale: Scale,
}

impl Default for TpccOptions {
    fn default() -> Self {
        Self {
            warehouses_per_shard: 1,
            remote_item_percent: 1,
            remote_payment_percent: 15,
            mode: Mode::Spec,
            scale: load::SPEC,
        }
    }
}

impl TpccOptions {
    /// The options from command-line flags or cluster-file keys; absent ones take the spec's.
    pub fn from_flags(
        warehouses_per_shard: Option<u64>,
        remote_item_percent: Option<u64>,
        remote_payment_percent: Option<u64>,
        mode: Option<&str>,
        scale: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let spec = Self::default();
        Ok(Self {
            warehouses_per_shard: warehouses_per_shard.unwrap_or(spec.warehouses_per_shard),
            remote_item_percent: remote_item_percent.unwrap_or(spec.remote_item_percent),
            remote_payment_percent: remote_payment_percent.unwrap_or(spec.remote_payment_percent),
            mode: mode.map(Self::parse_mode).transpose()?.unwrap_or(spec.mode),
            scale: scale.map(Self::parse_scale).transpose()?.unwrap_or(spec.scale),
        })
    }

    /// Parses `--tpcc-mode`.
    pub fn parse_mode(text: &str) -> Result<Mode, ConfigError> {
        match text {
            "spec" => Ok(Mode::Spec),
            "paper-compat" => Ok(Mode::PaperCompat),
            other => Err(meridian_core::error::unknown_name(
                "TPC-C mode",
                other,
                &["spec", "paper-compat"],
            )),
        }
    }

    /// Parses `--tpcc-scale`.
    pub fn parse_scale(text: &str) -> Result<Scale, ConfigError> {
        match text {
            "spec" => Ok(load::SPEC),
            "small" => Ok(load::SMALL),
            other => {
                Err(meridian_core::error::unknown_name("TPC-C scale", other, &["spec", "small"]))
            }
        }
    }
}

/// The workload.
#[derive(Debug)]
pub struct Tpcc {
    layout: Layout,
    options: TpccOptions,
    names: Arc<LastNames>,
}

impl Tpcc {
    /// Checks the options and builds the workload (and its last-name index).
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        let tpcc = options.tpcc.clone();
        if tpcc.warehouses_per_shard == 0 {
            return Err(ConfigError::new("TPC-C needs at least one warehouse per shard, got 0"));
        }
        for (name, value) in [
            ("--remote-item-pct", tpcc.remote_item_percent),
            ("--remote-payment-pct", tpcc.remote_payment_percent),
        ] {
            if value > 100 {
                return Err(ConfigError::new(format!(
                    "{name} is a percentage (0..=100), got {value}"
                )));
            }
        }
        let warehouses = u64::from(options.shards).saturating_mul(tpcc.warehouses_per_shard);
        if warehouses == 0 || warehouses > WAREHOUSES_MAX {
            return Err(ConfigError::new(format!(
                "TPC-C runs 1..={WAREHOUSES_MAX} warehouses, got {warehouses} ({} shards x {} per shard)",
                options.shards, tpcc.warehouses_per_shard
            )));
        }
        let layout = Layout { scale: tpcc.scale, warehouses, per_shard: tpcc.warehouses_per_shard };
        let names = Arc::new(LastNames::build(&tpcc.scale, warehouses));
        Ok(Self { layout, options: tpcc, names })
    }

    /// Where warehouses live and how big they are.
    pub fn layout(&self) -> Layout {
        self.layout
    }
}

impl Workload for Tpcc {
    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn describe(&self) -> serde_json::Value {
        let scale = &self.layout.scale;
        serde_json::json!({
            "name": "tpcc",
            "mode": match self.options.mode { Mode::Spec => "spec", Mode::PaperCompat => "paper-compat" },
            "mix_percent": match self.options.mode {
                Mode::Spec => serde_json::json!({"new-order": 45, "payment": 43, "order-status": 4, "delivery": 4, "stock-level": 4}),
                Mode::PaperCompat => serde_json::json!({"new-order": 100}),
            },
            "rollback_percent": if self.options.mode == Mode::Spec { ROLLBACK_PERCENT } else { 0 },
            "warehouses": self.layout.warehouses,
            "warehouses_per_shard": self.layout.per_shard,
            "remote_item_percent": self.options.remote_item_percent,
            "remote_payment_percent": self.options.remote_payment_percent,
            "by_last_name_percent": BY_LAST_NAME_PERCENT,
            "scale": if *scale == load::SPEC { "spec" } else { "small" },
            "districts": scale.districts,
            "customers_per_district": scale.customers,
            "items": scale.items,
        })
    }

    fn registry(&self) -> Registry {
        let layout = self.layout;
        let mut registry = Registry::default();
        registry.register(Arc::new(procs::NewOrder { layout }));
        registry.register(Arc::new(procs::Payment { layout }));
        registry.register(Arc::new(procs::OrderStatus { layout }));
        registry.register(Arc::new(procs::Delivery { layout }));
        registry.register(Arc::new(procs::StockLevel { layout }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        Partitioner::new(
            self.layout.shard(self.layout.warehouses).0 + 1,
            PartitionRule::LeadingInt { base: 1, per_shard: self.layout.per_shard },
        )
        .expect("warehouses and per_shard are checked at build")
        .with_replicated_table(schema::ITEM)
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        load::load_items(&self.layout.scale, store);
        let first = u64::from(shard.0) * self.layout.per_shard + 1;
        for w in first..first + self.layout.per_shard {
            load::load_warehouse(&self.layout.scale, w, store);
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(TpccGenerator {
            rng: child_rng(seed, "tpcc-client", u64::from(client)),
            layout: self.layout,
            options: self.options.clone(),
            names: self.names.clone(),
            origin: u64::from(client) + 1,
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(check::TpccCheck::new(self.layout))
    }
}

/// One client's transactions.
pub struct TpccGenerator {
    rng: Rng,
    layout: Layout,
    options: TpccOptions,
    names: Arc<LastNames>,
    origin: u64,
}

impl TpccGenerator {
    fn warehouse(&mut self) -> u64 {
        rand_range(&mut self.rng, 1, self.layout.warehouses)
    }

    fn district(&mut self) -> u64 {
        rand_range(&mut self.rng, 1, self.layout.scale.districts)
    }

    /// With probability `percent`, a uniformly random warehouse other than `home`.
    fn maybe_remote(&mut self, home: u64, percent: u64) -> u64 {
        if self.layout.warehouses > 1 && rand_range(&mut self.rng, 1, 100) <= percent {
            let other = rand_range(&mut self.rng, 1, self.layout.warehouses - 1);
            if other >= home {
                other + 1
            } else {
                other
            }
        } else {
            home
        }
    }

    /// A customer of `(w, d)`: by last name (60%) through the static index, else by NURand id.
    fn customer(&mut self, w: u64, d: u64) -> u64 {
        if rand_range(&mut self.rng, 1, 100) <= BY_LAST_NAME_PERCENT {
            let last = run_last_number(&mut self.rng, &NURAND_CONSTANTS);
            if let Some(c) = self.names.resolve(w, d, last) {
                return c;
            }
        }
        customer_id(&mut self.rng, &NURAND_CONSTANTS, self.layout.scale.customers)
    }

    fn new_order(&mut self, request: RequestId) -> TxnRequest {
        let w = self.warehouse();
        let d = self.district();
        let c = customer_id(&mut self.rng, &NURAND_CONSTANTS, self.layout.scale.customers);
        let count = rand_range(&mut self.rng, procs::ORDER_LINES_MIN, procs::ORDER_LINES_MAX);
        let rollback = self.options.mode == Mode::Spec
            && rand_range(&mut self.rng, 1, 100) <= ROLLBACK_PERCENT;
        let mut lines: Vec<LineRequest> = Vec::with_capacity(count as usize);
        while lines.len() < count as usize {
            let i_id = item_id(&mut self.rng, &NURAND_CONSTANTS, self.layout.scale.items);
            let supply_w = self.maybe_remote(w, self.options.remote_item_percent);
            if lines.iter().any(|l| l.i_id == i_id && l.supply_w == supply_w) {
                continue;
            }
            let quantity = rand_range(&mut self.rng, 1, 10);
            lines.push(LineRequest { i_id, supply_w, quantity });
        }
        if rollback {
            // §2.4.1.5: the last line names an unused item.
            lines.last_mut().expect("orders have lines").i_id = self.layout.scale.items + 1;
        }
        let args = NewOrderArgs { w, d, c, entry_d: RUN_DATE_BASE + request.0, lines };
        TxnRequest { proc: PROC_NEW_ORDER, args: args.to_args() }
    }

    fn payment(&mut self, request: RequestId) -> TxnRequest {
        let w = self.warehouse();
        let d = self.district();
        let c_w = self.maybe_remote(w, self.options.remote_payment_percent);
        let c_d = if c_w == w { d } else { self.district() };
        let c = self.customer(c_w, c_d);
        let args = PaymentArgs {
            w,
            d,
            c_w,
            c_d,
            c,
            amount_cents: rand_range(&mut self.rng, 100, 500_000) as i64,
            date: RUN_DATE_BASE + request.0,
            origin: self.origin,
            seq: request.0,
        };
        TxnRequest { proc: PROC_PAYMENT, args: args.to_args() }
    }
}

impl TxnGenerator for TpccGenerator {
    fn next(&mut self, request: RequestId) -> TxnRequest {
        let roll = match self.options.mode {
            Mode::Spec => uniform_u64(&mut self.rng, 100),
            Mode::PaperCompat => 0,
        };
        let mut bound = 0;
        let kind = MIX_PERCENT
            .iter()
            .position(|&p| {
                bound += p;
                roll < bound
            })
            .expect("the mix sums to 100");
        match kind {
            0 => self.new_order(request),
            1 => self.payment(request),
            2 => {
                let w = self.warehouse();
                let d = self.district();
                let c = self.customer(w, d);
                let args = vec![Datum::Uint(w), Datum::Uint(d), Datum::Uint(c)];
                TxnRequest { proc: PROC_ORDER_STATUS, args }
            }
            3 => {
                let w = self.warehouse();
                let carrier = rand_range(&mut self.rng, 1, 10);
                let args = vec![
                    Datum::Uint(w),
                    Datum::Uint(carrier),
                    Datum::Uint(RUN_DATE_BASE + request.0),
                ];
                TxnRequest { proc: PROC_DELIVERY, args }
            }
            _ => {
                let w = self.warehouse();
                let d = self.district();
                let threshold = rand_range(&mut self.rng, 10, 20);
                let args = vec![Datum::Uint(w), Datum::Uint(d), Datum::Uint(threshold)];
                TxnRequest { proc: PROC_STOCK_LEVEL, args }
            }
        }
    }
}
