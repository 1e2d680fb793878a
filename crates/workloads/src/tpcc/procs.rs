//! The five TPC-C transactions as Meridian procedures (TPC-C §2.4–2.8).
//!
//! - **NewOrder** `[w, d, c, entry_d, [[i, supply_w, qty]; 5..=15]]`: piece 0 on the home
//!   shard reads WAREHOUSE, CUSTOMER and every ITEM (replicated, so local), takes
//!   `D_NEXT_O_ID` and updates the home shard's stock; one piece per other supplying shard
//!   updates its stock; a last piece on the home shard, which needs the order id and the
//!   stock's `S_DIST_xx`, inserts ORDER, NEW-ORDER, the ORDER-LINEs and the ORDER_CUST entry.
//!   An unknown item is the 1% rollback: a user abort, nothing written.
//! - **Payment** `[w, d, c_w, c_d, c, amount_cents, date, origin, seq]`: one-shot, a piece for
//!   the home warehouse (W_YTD, D_YTD, a HISTORY row) and one for the customer's. The
//!   generator resolves a customer chosen by last name through the static index.
//! - **OrderStatus** `[w, d, c]` (read-only, two rounds): the customer and its newest order
//!   (reverse scan of ORDER_CUST), then that order and its lines.
//! - **Delivery** `[w, carrier, date]` (three rounds on one shard): the oldest NEW-ORDER of
//!   every district, then those orders (customer, line count), then delete each NEW-ORDER, set
//!   the carrier and the lines' delivery date, and credit the customer with the lines' sum.
//!   A district with nothing to deliver is skipped.
//! - **StockLevel** `[w, d, threshold]` (read-only, three rounds): `D_NEXT_O_ID`, the lines
//!   of the last 20 orders, then the stock of their distinct items below the threshold.
//!
//! Dependent (multi-round) pieces run as waves under protocols that support them; a protocol
//! that needs every key up front refuses them with its own message.

use super::load::Scale;
use super::schema::*;
use meridian_core::key::Key;
use meridian_core::txn::{
    Args, Datum, KeySet, PieceEffects, PieceOutput, PieceSpec, Plan, PlanContext, ProcError,
    Procedure, Reads, ScanRange, ShardTarget, UserAbort, Write,
};
use meridian_core::ShardId;

/// Most order lines per order.
pub const ORDER_LINES_MAX: u64 = 15;
/// Fewest order lines per order.
pub const ORDER_LINES_MIN: u64 = 5;
/// Orders StockLevel looks back over.
pub const STOCK_LEVEL_ORDERS: u64 = 20;
/// Most characters of C_DATA.
pub const CUSTOMER_DATA_MAX: usize = 500;

const _: () = assert!(
    (STOCK_LEVEL_ORDERS * ORDER_LINES_MAX) as u32 <= meridian_core::txn::SCAN_ROWS_MAX,
    "StockLevel's scan fits in one scan"
);

/// Where warehouses live and how big they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Table sizes.
    pub scale: Scale,
    /// Warehouses in all.
    pub warehouses: u64,
    /// Consecutive warehouses per shard.
    pub per_shard: u64,
}

impl Layout {
    /// The shard of warehouse `w`.
    pub fn shard(&self, w: u64) -> ShardId {
        ShardId(((w - 1) / self.per_shard) as u32)
    }

    fn target(&self, w: u64) -> ShardTarget {
        ShardTarget::Shard(self.shard(w))
    }

    fn check_w(&self, w: u64) -> Result<u64, ProcError> {
        if (1..=self.warehouses).contains(&w) {
            Ok(w)
        } else {
            Err(ProcError::BadArgs(format!("warehouse {w} is not in 1..={}", self.warehouses)))
        }
    }

    fn check_d(&self, d: u64) -> Result<u64, ProcError> {
        if (1..=self.scale.districts).contains(&d) {
            Ok(d)
        } else {
            Err(ProcError::BadArgs(format!("district {d} is not in 1..={}", self.scale.districts)))
        }
    }

    fn check_c(&self, c: u64) -> Result<u64, ProcError> {
        if (1..=self.scale.customers).contains(&c) {
            Ok(c)
        } else {
            Err(ProcError::BadArgs(format!("customer {c} is not in 1..={}", self.scale.customers)))
        }
    }
}

fn uint(args: &[Datum], index: usize, what: &str) -> Result<u64, ProcError> {
    args.get(index).and_then(Datum::as_uint).ok_or_else(|| {
        ProcError::BadArgs(format!("argument {index} ({what}) must be an unsigned integer"))
    })
}

fn no_piece(name: &str, piece: u32) -> ProcError {
    ProcError::BadArgs(format!("{name} has no piece {piece}"))
}

/// A procedure's own decoding failure during `execute`: the store holds something the
/// loader and the procedures never write. Reported as an abort naming it.
fn corrupt(message: String) -> UserAbort {
    UserAbort(format!("corrupt row: {message}"))
}

fn input_uint(inputs: &[&PieceOutput], piece: usize, index: usize) -> Result<u64, ProcError> {
    inputs
        .get(piece)
        .and_then(|o| o.get(index))
        .and_then(Datum::as_uint)
        .ok_or_else(|| ProcError::Contract(format!("input {piece} lacks value {index}")))
}

fn input_list<'a>(
    inputs: &[&'a PieceOutput],
    piece: usize,
    index: usize,
) -> Result<&'a [Datum], ProcError> {
    inputs
        .get(piece)
        .and_then(|o| o.get(index))
        .and_then(Datum::as_list)
        .ok_or_else(|| ProcError::Contract(format!("input {piece} lacks list {index}")))
}

fn to_abort(error: ProcError) -> UserAbort {
    UserAbort(error.to_string())
}

fn scan_prefix(prefix: Key, limit: u32, reverse: bool) -> ScanRange {
    ScanRange { end: after_prefix(prefix.clone()), start: prefix, limit, reverse }
}

// ---------------------------------------------------------------------------------------------
// NewOrder

/// One order line's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRequest {
    /// OL_I_ID (an id beyond ITEM is the rollback).
    pub i_id: u64,
    /// OL_SUPPLY_W_ID.
    pub supply_w: u64,
    /// OL_QUANTITY.
    pub quantity: u64,
}

/// NewOrder's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrderArgs {
    /// Home warehouse.
    pub w: u64,
    /// District.
    pub d: u64,
    /// Customer.
    pub c: u64,
    /// O_ENTRY_D.
    pub entry_d: u64,
    /// The lines, distinct by (item, supplying warehouse).
    pub lines: Vec<LineRequest>,
}

impl NewOrderArgs {
    /// As procedure arguments.
    pub fn to_args(&self) -> Args {
        let lines = self
            .lines
            .iter()
            .map(|l| {
                Datum::List(vec![
                    Datum::Uint(l.i_id),
                    Datum::Uint(l.supply_w),
                    Datum::Uint(l.quantity),
                ])
            })
            .collect();
        vec![
            Datum::Uint(self.w),
            Datum::Uint(self.d),
            Datum::Uint(self.c),
            Datum::Uint(self.entry_d),
            Datum::List(lines),
        ]
    }

    fn parse(layout: &Layout, args: &Args) -> Result<Self, ProcError> {
        let w = layout.check_w(uint(args, 0, "w")?)?;
        let d = layout.check_d(uint(args, 1, "d")?)?;
        let c = layout.check_c(uint(args, 2, "c")?)?;
        let entry_d = uint(args, 3, "entry_d")?;
        let items = args
            .get(4)
            .and_then(Datum::as_list)
            .ok_or_else(|| ProcError::BadArgs("argument 4 must be the list of lines".into()))?;
        if !(ORDER_LINES_MIN..=ORDER_LINES_MAX).contains(&(items.len() as u64)) {
            return Err(ProcError::BadArgs(format!(
                "an order has {ORDER_LINES_MIN}..={ORDER_LINES_MAX} lines, not {}",
                items.len()
            )));
        }
        let mut lines: Vec<LineRequest> = Vec::with_capacity(items.len());
        for item in items {
            let fields = item.as_list().unwrap_or(&[]);
            let line = LineRequest {
                i_id: uint(fields, 0, "i_id")?,
                supply_w: layout.check_w(uint(fields, 1, "supply_w")?)?,
                quantity: uint(fields, 2, "quantity")?,
            };
            if !(1..=10).contains(&line.quantity) {
                return Err(ProcError::BadArgs(format!(
                    "quantity {} not in 1..=10",
                    line.quantity
                )));
            }
            if lines.iter().any(|l| l.i_id == line.i_id && l.supply_w == line.supply_w) {
                return Err(ProcError::BadArgs(format!(
                    "item {} from warehouse {} twice in one order",
                    line.i_id, line.supply_w
                )));
            }
            lines.push(line);
        }
        Ok(Self { w, d, c, entry_d, lines })
    }

    /// Supplying shards other than the home one, ascending: piece `k` (1-based) serves the
    /// `k`-th.
    fn remote_shards(&self, layout: &Layout) -> Vec<ShardId> {
        let home = layout.shard(self.w);
        let mut shards: Vec<ShardId> =
            self.lines.iter().map(|l| layout.shard(l.supply_w)).filter(|&s| s != home).collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    /// Indexes of the lines whose stock piece `piece` updates.
    fn lines_of(&self, layout: &Layout, piece: u32) -> Vec<usize> {
        let shard = match piece {
            0 => layout.shard(self.w),
            k => self.remote_shards(layout)[k as usize - 1],
        };
        (0..self.lines.len()).filter(|&i| layout.shard(self.lines[i].supply_w) == shard).collect()
    }
}

/// The 1% rollback's user abort (§2.4.2.3): the order names an unused item.
fn rollback(i_id: u64) -> UserAbort {
    UserAbort(format!("rollback: item {i_id} does not exist"))
}

/// Applies one line's order to its stock row (§2.4.2.2) and returns `[line, S_DIST_xx]`.
fn order_stock(
    stock: &mut Stock,
    line_index: usize,
    line: &LineRequest,
    d: u64,
    home: u64,
) -> Result<Datum, UserAbort> {
    let quantity = line.quantity as i64;
    stock.quantity = if stock.quantity >= quantity + 10 {
        stock.quantity - quantity
    } else {
        stock.quantity - quantity + 91
    };
    stock.ytd += quantity;
    stock.order_cnt += 1;
    if line.supply_w != home {
        stock.remote_cnt += 1;
    }
    let dist = stock
        .dist
        .get(d as usize - 1)
        .ok_or_else(|| corrupt(format!("stock has no S_DIST_{d:02}")))?;
    Ok(Datum::List(vec![Datum::Uint(line_index as u64), Datum::Bytes(dist.clone().into_bytes())]))
}

/// NewOrder.
#[derive(Debug)]
pub struct NewOrder {
    /// The layout.
    pub layout: Layout,
}

impl NewOrder {
    fn stock_effects(
        &self,
        args: &NewOrderArgs,
        lines: &[usize],
        values: &[Option<&[u8]>],
        effects: &mut PieceEffects,
    ) -> Result<Vec<Datum>, UserAbort> {
        let mut infos = Vec::with_capacity(lines.len());
        for (&index, value) in lines.iter().zip(values) {
            let line = &args.lines[index];
            if value.is_none() && line.i_id > self.layout.scale.items {
                // The rollback's unused item has no stock either; a stock piece on another
                // shard may see that before piece 0 sees the missing ITEM row.
                return Err(rollback(line.i_id));
            }
            let mut stock = Stock::decode(*value).map_err(corrupt)?;
            infos.push(order_stock(&mut stock, index, line, args.d, args.w)?);
            effects.writes.push(Write {
                key: stock_key(line.supply_w, line.i_id),
                value: Some(stock.encode()),
            });
        }
        Ok(infos)
    }
}

impl Procedure for NewOrder {
    fn name(&self) -> &'static str {
        "tpcc-new-order"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let order = NewOrderArgs::parse(&self.layout, args)?;
        check_shards(&self.layout, context)?;
        let remote = order.remote_shards(&self.layout);
        let mut plan = vec![PieceSpec { target: self.layout.target(order.w), deps: Vec::new() }];
        plan.extend(
            remote.iter().map(|&s| PieceSpec { target: ShardTarget::Shard(s), deps: Vec::new() }),
        );
        plan.push(PieceSpec {
            target: self.layout.target(order.w),
            deps: (0..=remote.len() as u32).collect(),
        });
        Ok(plan)
    }

    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let order = NewOrderArgs::parse(&self.layout, args)?;
        let remote = order.remote_shards(&self.layout).len() as u32;
        let stock = |lines: Vec<usize>| -> Vec<Key> {
            lines.iter().map(|&i| stock_key(order.lines[i].supply_w, order.lines[i].i_id)).collect()
        };
        let (w, d) = (order.w, order.d);
        if piece == 0 {
            let stocks = stock(order.lines_of(&self.layout, 0));
            let mut reads = vec![warehouse_key(w), district_key(w, d), customer_key(w, d, order.c)];
            reads.extend(order.lines.iter().map(|l| item_key(l.i_id)));
            reads.extend(stocks.iter().cloned());
            let mut writes = vec![district_key(w, d)];
            writes.extend(stocks);
            Ok(KeySet { reads, writes, scans: Vec::new() })
        } else if piece <= remote {
            let stocks = stock(order.lines_of(&self.layout, piece));
            Ok(KeySet { reads: stocks.clone(), writes: stocks, scans: Vec::new() })
        } else if piece == remote + 1 {
            let o = input_uint(inputs, 0, 0)?;
            let mut writes =
                vec![order_key(w, d, o), new_order_key(w, d, o), order_cust_key(w, d, order.c, o)];
            writes.extend((1..=order.lines.len() as u64).map(|n| order_line_key(w, d, o, n)));
            Ok(KeySet { reads: Vec::new(), writes, scans: Vec::new() })
        } else {
            Err(no_piece(self.name(), piece))
        }
    }

    /// The last piece's rows are keyed by the order number piece 0 takes from the district
    /// row. The district row guards them: every NewOrder of the district writes it, and the
    /// other procedures touching a district's orders (OrderStatus, Delivery, StockLevel)
    /// scan, so no protocol ordering by keys runs them.
    fn guard(&self, piece: u32, args: &Args) -> Option<Vec<Key>> {
        let order = NewOrderArgs::parse(&self.layout, args).ok()?;
        let remote = order.remote_shards(&self.layout).len() as u32;
        (piece == remote + 1).then(|| vec![district_key(order.w, order.d)])
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let order = NewOrderArgs::parse(&self.layout, args).map_err(to_abort)?;
        let remote = order.remote_shards(&self.layout).len() as u32;
        let mut effects = PieceEffects::default();
        if piece == 0 {
            let v = &reads.values;
            let warehouse = Warehouse::decode(v[0]).map_err(corrupt)?;
            let mut district = District::decode(v[1]).map_err(corrupt)?;
            let customer = Customer::decode(v[2]).map_err(corrupt)?;
            let items = &v[3..3 + order.lines.len()];
            let mut prices = Vec::with_capacity(items.len());
            for (line, value) in order.lines.iter().zip(items) {
                // The 1% rollback: an unused item id (§2.4.2.3).
                let Some(value) = value else { return Err(rollback(line.i_id)) };
                let item = Item::decode(Some(value)).map_err(corrupt)?;
                prices.push(Datum::Int(item.price_cents));
            }
            let o = district.next_o_id;
            district.next_o_id += 1;
            effects.writes.push(Write {
                key: district_key(order.w, order.d),
                value: Some(district.encode()),
            });
            let lines = order.lines_of(&self.layout, 0);
            let infos =
                self.stock_effects(&order, &lines, &v[3 + order.lines.len()..], &mut effects)?;
            effects.output = vec![
                Datum::Uint(o),
                Datum::Uint(u64::from(warehouse.tax)),
                Datum::Uint(u64::from(district.tax)),
                Datum::Uint(u64::from(customer.discount)),
                Datum::List(prices),
                Datum::List(infos),
            ];
        } else if piece <= remote {
            let lines = order.lines_of(&self.layout, piece);
            let infos = self.stock_effects(&order, &lines, &reads.values, &mut effects)?;
            effects.output = vec![Datum::List(infos)];
        } else if piece == remote + 1 {
            let o = input_uint(inputs, 0, 0).map_err(to_abort)?;
            let taxes = input_uint(inputs, 0, 1).map_err(to_abort)?
                + input_uint(inputs, 0, 2).map_err(to_abort)?;
            let discount = input_uint(inputs, 0, 3).map_err(to_abort)?;
            let prices = input_list(inputs, 0, 4).map_err(to_abort)?;
            // S_DIST_xx per line, from piece 0's infos and every remote piece's.
            let mut dist_info: Vec<Option<String>> = vec![None; order.lines.len()];
            let mut sources = vec![input_list(inputs, 0, 5).map_err(to_abort)?];
            for k in 1..=remote as usize {
                sources.push(input_list(inputs, k, 0).map_err(to_abort)?);
            }
            for info in sources.into_iter().flatten() {
                let fields = info.as_list().unwrap_or(&[]);
                let (Some(index), Some(dist)) = (
                    fields.first().and_then(Datum::as_uint),
                    fields.get(1).and_then(Datum::as_bytes),
                ) else {
                    return Err(to_abort(ProcError::Contract("malformed stock info".into())));
                };
                if let Some(slot) = dist_info.get_mut(index as usize) {
                    *slot = Some(String::from_utf8_lossy(dist).into_owned());
                }
            }
            let (w, d) = (order.w, order.d);
            let mut total_cents: i128 = 0;
            for (n, line) in order.lines.iter().enumerate() {
                let price = prices.get(n).and_then(Datum::as_int).ok_or_else(|| {
                    to_abort(ProcError::Contract(format!("no price for line {n}")))
                })?;
                let amount_cents = price * line.quantity as i64;
                total_cents += i128::from(amount_cents);
                let row = OrderLine {
                    i_id: line.i_id,
                    supply_w_id: line.supply_w,
                    delivery_d: None,
                    quantity: line.quantity,
                    amount_cents,
                    dist_info: dist_info[n].take().ok_or_else(|| {
                        to_abort(ProcError::Contract(format!("no S_DIST for line {n}")))
                    })?,
                };
                effects.writes.push(Write {
                    key: order_line_key(w, d, o, n as u64 + 1),
                    value: Some(row.encode()),
                });
            }
            let row = Order {
                c_id: order.c,
                entry_d: order.entry_d,
                carrier_id: None,
                ol_cnt: order.lines.len() as u64,
                all_local: order.lines.iter().all(|l| l.supply_w == w),
            };
            effects.writes.push(Write { key: order_key(w, d, o), value: Some(row.encode()) });
            effects.writes.push(Write { key: new_order_key(w, d, o), value: Some(Vec::new()) });
            effects
                .writes
                .push(Write { key: order_cust_key(w, d, order.c, o), value: Some(Vec::new()) });
            // total = Σ amount × (1 − discount) × (1 + w_tax + d_tax), rates in 1/10,000.
            let total =
                total_cents * (10_000 - i128::from(discount)) * (10_000 + i128::from(taxes))
                    / 100_000_000;
            effects.output = vec![Datum::Uint(o), Datum::Int(total as i64)];
        } else {
            return Err(to_abort(no_piece(self.name(), piece)));
        }
        Ok(effects)
    }
}

/// `rounds` pieces on `target`, each needing the one before: a multi-round procedure on one
/// shard.
fn chain(target: ShardTarget, rounds: u32) -> Plan {
    (0..rounds)
        .map(|piece| PieceSpec { target, deps: piece.checked_sub(1).into_iter().collect() })
        .collect()
}

fn check_shards(layout: &Layout, context: PlanContext<'_>) -> Result<(), ProcError> {
    let needed = layout.shard(layout.warehouses).0 + 1;
    if context.partitioner.shards() < needed {
        return Err(ProcError::BadArgs(format!(
            "{} warehouses need {needed} shards, the cluster has {}",
            layout.warehouses,
            context.partitioner.shards()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Payment

/// Payment's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentArgs {
    /// Home warehouse.
    pub w: u64,
    /// Home district.
    pub d: u64,
    /// Customer's warehouse.
    pub c_w: u64,
    /// Customer's district.
    pub c_d: u64,
    /// Customer.
    pub c: u64,
    /// H_AMOUNT, cents.
    pub amount_cents: i64,
    /// H_DATE.
    pub date: u64,
    /// HISTORY key: origin (client + 1).
    pub origin: u64,
    /// HISTORY key: sequence (request id).
    pub seq: u64,
}

impl PaymentArgs {
    /// As procedure arguments.
    pub fn to_args(&self) -> Args {
        vec![
            Datum::Uint(self.w),
            Datum::Uint(self.d),
            Datum::Uint(self.c_w),
            Datum::Uint(self.c_d),
            Datum::Uint(self.c),
            Datum::Int(self.amount_cents),
            Datum::Uint(self.date),
            Datum::Uint(self.origin),
            Datum::Uint(self.seq),
        ]
    }

    fn parse(layout: &Layout, args: &Args) -> Result<Self, ProcError> {
        let amount_cents = args
            .get(5)
            .and_then(Datum::as_int)
            .filter(|a| (100..=500_000).contains(a))
            .ok_or_else(|| {
                ProcError::BadArgs("argument 5 (amount) must be 100..=500000 cents".into())
            })?;
        let origin = uint(args, 7, "origin")?;
        if origin == 0 {
            return Err(ProcError::BadArgs("history origin 0 belongs to the loader".into()));
        }
        Ok(Self {
            w: layout.check_w(uint(args, 0, "w")?)?,
            d: layout.check_d(uint(args, 1, "d")?)?,
            c_w: layout.check_w(uint(args, 2, "c_w")?)?,
            c_d: layout.check_d(uint(args, 3, "c_d")?)?,
            c: layout.check_c(uint(args, 4, "c")?)?,
            amount_cents,
            date: uint(args, 6, "date")?,
            origin,
            seq: uint(args, 8, "seq")?,
        })
    }
}

/// Payment.
#[derive(Debug)]
pub struct Payment {
    /// The layout.
    pub layout: Layout,
}

impl Procedure for Payment {
    fn name(&self) -> &'static str {
        "tpcc-payment"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let p = PaymentArgs::parse(&self.layout, args)?;
        check_shards(&self.layout, context)?;
        Ok(vec![
            PieceSpec { target: self.layout.target(p.w), deps: Vec::new() },
            PieceSpec { target: self.layout.target(p.c_w), deps: Vec::new() },
        ])
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let p = PaymentArgs::parse(&self.layout, args)?;
        match piece {
            0 => Ok(KeySet {
                reads: vec![warehouse_key(p.w), district_key(p.w, p.d)],
                writes: vec![
                    warehouse_key(p.w),
                    district_key(p.w, p.d),
                    history_key(p.w, p.d, p.origin, p.seq),
                ],
                scans: Vec::new(),
            }),
            1 => {
                let key = customer_key(p.c_w, p.c_d, p.c);
                Ok(KeySet { reads: vec![key.clone()], writes: vec![key], scans: Vec::new() })
            }
            _ => Err(no_piece(self.name(), piece)),
        }
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let p = PaymentArgs::parse(&self.layout, args).map_err(to_abort)?;
        let mut effects = PieceEffects::default();
        match piece {
            0 => {
                let mut warehouse = Warehouse::decode(reads.values[0]).map_err(corrupt)?;
                let mut district = District::decode(reads.values[1]).map_err(corrupt)?;
                warehouse.ytd_cents += p.amount_cents;
                district.ytd_cents += p.amount_cents;
                let history = History {
                    c_id: p.c,
                    c_d_id: p.c_d,
                    c_w_id: p.c_w,
                    d_id: p.d,
                    w_id: p.w,
                    date: p.date,
                    amount_cents: p.amount_cents,
                    data: format!("{}    {}", warehouse.name, district.name),
                };
                effects.writes = vec![
                    Write { key: warehouse_key(p.w), value: Some(warehouse.encode()) },
                    Write { key: district_key(p.w, p.d), value: Some(district.encode()) },
                    Write {
                        key: history_key(p.w, p.d, p.origin, p.seq),
                        value: Some(history.encode()),
                    },
                ];
            }
            1 => {
                let mut customer = Customer::decode(reads.values[0]).map_err(corrupt)?;
                customer.balance_cents -= p.amount_cents;
                customer.ytd_payment_cents += p.amount_cents;
                customer.payment_cnt += 1;
                if customer.credit == "BC" {
                    // §2.5.2.2: the payment's ids and amount go in front of C_DATA.
                    let mut data = format!(
                        "{} {} {} {} {} {}.{:02}|",
                        p.c,
                        p.c_d,
                        p.c_w,
                        p.d,
                        p.w,
                        p.amount_cents / 100,
                        p.amount_cents % 100
                    );
                    data.push_str(&customer.data);
                    data.truncate(CUSTOMER_DATA_MAX);
                    customer.data = data;
                }
                effects.output = vec![Datum::Int(customer.balance_cents)];
                effects.writes = vec![Write {
                    key: customer_key(p.c_w, p.c_d, p.c),
                    value: Some(customer.encode()),
                }];
            }
            _ => return Err(to_abort(no_piece(self.name(), piece))),
        }
        Ok(effects)
    }
}

// ---------------------------------------------------------------------------------------------
// OrderStatus

/// OrderStatus.
#[derive(Debug)]
pub struct OrderStatus {
    /// The layout.
    pub layout: Layout,
}

impl OrderStatus {
    fn parse(&self, args: &Args) -> Result<(u64, u64, u64), ProcError> {
        Ok((
            self.layout.check_w(uint(args, 0, "w")?)?,
            self.layout.check_d(uint(args, 1, "d")?)?,
            self.layout.check_c(uint(args, 2, "c")?)?,
        ))
    }
}

impl Procedure for OrderStatus {
    fn name(&self) -> &'static str {
        "tpcc-order-status"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (w, _, _) = self.parse(args)?;
        check_shards(&self.layout, context)?;
        Ok(chain(self.layout.target(w), 2))
    }

    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (w, d, c) = self.parse(args)?;
        match piece {
            0 => Ok(KeySet {
                reads: vec![customer_key(w, d, c)],
                writes: Vec::new(),
                scans: vec![scan_prefix(
                    Key::table(ORDER_CUST).u64(w).u64(d).u64(c).build(),
                    1,
                    true,
                )],
            }),
            1 => {
                let o = input_uint(inputs, 0, 1)?;
                if o == 0 {
                    return Ok(KeySet::default());
                }
                Ok(KeySet {
                    reads: vec![order_key(w, d, o)],
                    writes: Vec::new(),
                    scans: vec![scan_prefix(
                        Key::table(ORDER_LINE).u64(w).u64(d).u64(o).build(),
                        ORDER_LINES_MAX as u32,
                        false,
                    )],
                })
            }
            _ => Err(no_piece(self.name(), piece)),
        }
    }

    fn execute(
        &self,
        piece: u32,
        _args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let output = match piece {
            0 => {
                let customer = Customer::decode(reads.values[0]).map_err(corrupt)?;
                let newest = reads.scans[0]
                    .first()
                    .and_then(|(key, _)| key_ids::<4>(key))
                    .map_or(0, |[_, _, _, o]| o);
                vec![Datum::Int(customer.balance_cents), Datum::Uint(newest)]
            }
            1 if reads.values.is_empty() => vec![Datum::Uint(0), Datum::Uint(0), Datum::Int(0)],
            1 => {
                let order = Order::decode(reads.values[0]).map_err(corrupt)?;
                let mut sum = 0;
                for (_, value) in &reads.scans[0] {
                    sum += OrderLine::decode(Some(value)).map_err(corrupt)?.amount_cents;
                }
                vec![
                    Datum::Uint(order.carrier_id.unwrap_or(0)),
                    Datum::Uint(reads.scans[0].len() as u64),
                    Datum::Int(sum),
                ]
            }
            _ => return Err(to_abort(no_piece(self.name(), piece))),
        };
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}

// ---------------------------------------------------------------------------------------------
// Delivery

/// Delivery.
#[derive(Debug)]
pub struct Delivery {
    /// The layout.
    pub layout: Layout,
}

/// One district's delivery, as piece 1 outputs it: `[d, o, c, ol_cnt]`.
fn delivery_entries(inputs: &[&PieceOutput]) -> Result<Vec<[u64; 4]>, ProcError> {
    input_list(inputs, 0, 0)?
        .iter()
        .map(|entry| {
            let fields = entry.as_list().unwrap_or(&[]);
            let mut out = [0; 4];
            for (slot, field) in out.iter_mut().zip(fields) {
                *slot = field.as_uint().ok_or_else(|| ProcError::Contract("bad entry".into()))?;
            }
            if fields.len() != 4 || out[3] > ORDER_LINES_MAX {
                return Err(ProcError::Contract(format!("bad delivery entry {fields:?}")));
            }
            Ok(out)
        })
        .collect()
}

impl Delivery {
    fn parse(&self, args: &Args) -> Result<(u64, u64, u64), ProcError> {
        let carrier = uint(args, 1, "carrier")?;
        if !(1..=10).contains(&carrier) {
            return Err(ProcError::BadArgs(format!("carrier {carrier} not in 1..=10")));
        }
        Ok((self.layout.check_w(uint(args, 0, "w")?)?, carrier, uint(args, 2, "date")?))
    }
}

impl Procedure for Delivery {
    fn name(&self) -> &'static str {
        "tpcc-delivery"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (w, _, _) = self.parse(args)?;
        check_shards(&self.layout, context)?;
        Ok(chain(self.layout.target(w), 3))
    }

    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (w, _, _) = self.parse(args)?;
        match piece {
            0 => Ok(KeySet {
                reads: Vec::new(),
                writes: Vec::new(),
                scans: (1..=self.layout.scale.districts)
                    .map(|d| scan_prefix(Key::table(NEW_ORDER).u64(w).u64(d).build(), 1, false))
                    .collect(),
            }),
            1 => {
                let oldest = input_list(inputs, 0, 0)?;
                let reads = oldest
                    .iter()
                    .zip(1..)
                    .filter_map(|(o, d)| o.as_uint().filter(|&o| o > 0).map(|o| order_key(w, d, o)))
                    .collect();
                Ok(KeySet { reads, writes: Vec::new(), scans: Vec::new() })
            }
            2 => {
                let mut keys = KeySet::default();
                for [d, o, c, ol_cnt] in delivery_entries(inputs)? {
                    keys.reads.push(order_key(w, d, o));
                    keys.reads.push(customer_key(w, d, c));
                    keys.reads.extend((1..=ol_cnt).map(|n| order_line_key(w, d, o, n)));
                    keys.writes.push(order_key(w, d, o));
                    keys.writes.push(customer_key(w, d, c));
                    keys.writes.push(new_order_key(w, d, o));
                    keys.writes.extend((1..=ol_cnt).map(|n| order_line_key(w, d, o, n)));
                }
                Ok(keys)
            }
            _ => Err(no_piece(self.name(), piece)),
        }
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (w, carrier, date) = self.parse(args).map_err(to_abort)?;
        let mut effects = PieceEffects::default();
        match piece {
            0 => {
                let oldest = reads
                    .scans
                    .iter()
                    .map(|rows| {
                        let o = rows
                            .first()
                            .and_then(|(k, _)| key_ids::<3>(k))
                            .map_or(0, |[_, _, o]| o);
                        Datum::Uint(o)
                    })
                    .collect();
                effects.output = vec![Datum::List(oldest)];
            }
            1 => {
                let oldest = input_list(inputs, 0, 0).map_err(to_abort)?;
                let mut values = reads.values.iter();
                let mut entries = Vec::new();
                for (o, d) in oldest.iter().zip(1u64..) {
                    let Some(o) = o.as_uint().filter(|&o| o > 0) else { continue };
                    let order = Order::decode(values.next().copied().flatten()).map_err(corrupt)?;
                    entries.push(Datum::List(vec![
                        Datum::Uint(d),
                        Datum::Uint(o),
                        Datum::Uint(order.c_id),
                        Datum::Uint(order.ol_cnt.min(ORDER_LINES_MAX)),
                    ]));
                }
                effects.output = vec![Datum::List(entries)];
            }
            2 => {
                let mut values = reads.values.iter();
                let mut next = || values.next().copied().flatten();
                let mut delivered = 0;
                for [d, o, c, ol_cnt] in delivery_entries(inputs).map_err(to_abort)? {
                    let mut order = Order::decode(next()).map_err(corrupt)?;
                    let mut customer = Customer::decode(next()).map_err(corrupt)?;
                    let mut sum = 0;
                    for n in 1..=ol_cnt {
                        let mut line = OrderLine::decode(next()).map_err(corrupt)?;
                        sum += line.amount_cents;
                        line.delivery_d = Some(date);
                        effects.writes.push(Write {
                            key: order_line_key(w, d, o, n),
                            value: Some(line.encode()),
                        });
                    }
                    order.carrier_id = Some(carrier);
                    customer.balance_cents += sum;
                    customer.delivery_cnt += 1;
                    effects
                        .writes
                        .push(Write { key: order_key(w, d, o), value: Some(order.encode()) });
                    effects
                        .writes
                        .push(Write { key: customer_key(w, d, c), value: Some(customer.encode()) });
                    effects.writes.push(Write { key: new_order_key(w, d, o), value: None });
                    delivered += 1;
                }
                effects.output = vec![Datum::Uint(delivered)];
            }
            _ => return Err(to_abort(no_piece(self.name(), piece))),
        }
        Ok(effects)
    }
}

// ---------------------------------------------------------------------------------------------
// StockLevel

/// StockLevel.
#[derive(Debug)]
pub struct StockLevel {
    /// The layout.
    pub layout: Layout,
}

impl StockLevel {
    fn parse(&self, args: &Args) -> Result<(u64, u64, i64), ProcError> {
        let threshold = uint(args, 2, "threshold")?;
        if !(10..=20).contains(&threshold) {
            return Err(ProcError::BadArgs(format!("threshold {threshold} not in 10..=20")));
        }
        Ok((
            self.layout.check_w(uint(args, 0, "w")?)?,
            self.layout.check_d(uint(args, 1, "d")?)?,
            threshold as i64,
        ))
    }
}

impl Procedure for StockLevel {
    fn name(&self) -> &'static str {
        "tpcc-stock-level"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (w, _, _) = self.parse(args)?;
        check_shards(&self.layout, context)?;
        Ok(chain(self.layout.target(w), 3))
    }

    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (w, d, _) = self.parse(args)?;
        match piece {
            0 => Ok(KeySet { reads: vec![district_key(w, d)], ..KeySet::default() }),
            1 => {
                let next = input_uint(inputs, 0, 0)?;
                let first = next.saturating_sub(STOCK_LEVEL_ORDERS).max(1);
                let range = ScanRange {
                    start: Key::table(ORDER_LINE).u64(w).u64(d).u64(first).build(),
                    end: Key::table(ORDER_LINE).u64(w).u64(d).u64(next).build(),
                    limit: (STOCK_LEVEL_ORDERS * ORDER_LINES_MAX) as u32,
                    reverse: false,
                };
                Ok(KeySet { scans: vec![range], ..KeySet::default() })
            }
            2 => {
                let items = input_list(inputs, 0, 0)?;
                let reads =
                    items.iter().filter_map(Datum::as_uint).map(|i| stock_key(w, i)).collect();
                Ok(KeySet { reads, ..KeySet::default() })
            }
            _ => Err(no_piece(self.name(), piece)),
        }
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (_, _, threshold) = self.parse(args).map_err(to_abort)?;
        let output = match piece {
            0 => vec![Datum::Uint(District::decode(reads.values[0]).map_err(corrupt)?.next_o_id)],
            1 => {
                let mut items = Vec::with_capacity(reads.scans[0].len());
                for (_, value) in &reads.scans[0] {
                    items.push(OrderLine::decode(Some(value)).map_err(corrupt)?.i_id);
                }
                items.sort_unstable();
                items.dedup();
                vec![Datum::List(items.into_iter().map(Datum::Uint).collect())]
            }
            2 => {
                let mut low = 0;
                for value in &reads.values {
                    // A line's stock row always exists: NewOrder rolls back unknown items.
                    low += u64::from(
                        Stock::decode(value.as_deref()).map_err(corrupt)?.quantity < threshold,
                    );
                }
                vec![Datum::Uint(low)]
            }
            _ => return Err(to_abort(no_piece(self.name(), piece))),
        };
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}
