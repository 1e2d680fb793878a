//! TPC-C's nine tables on a key-value store, plus one secondary index.
//!
//! Keys are order-preserving composites `table ‖ w_id ‖ ...` of big-endian `u64`s, so every
//! table but ITEM leads with the warehouse (the partitioner places warehouses on shards) and a
//! district's rows form one key range (scans by prefix). ITEM is replicated on every shard.
//! HISTORY has no natural key: `(w, d, origin, seq)`, where origin 0 is the loader (seq the
//! customer) and origin `client + 1` a run (seq the request id), so CC8/CC9 scan by warehouse.
//! ORDER_CUST `(w, d, c, o)` is Silo's `oorder_c_id_idx`: OrderStatus reverse-scans it for a
//! customer's newest order.
//!
//! Rows are serde structs encoded with postcard. Money is integer cents, rates are integer
//! basis points of basis points (1/10,000: a tax of 0.1234 is 1234), dates are logical
//! (`u64`, the loader's date or the request id).

use meridian_core::key::{Key, Value};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// WAREHOUSE `(w)`.
pub const WAREHOUSE: u8 = 10;
/// DISTRICT `(w, d)`.
pub const DISTRICT: u8 = 11;
/// CUSTOMER `(w, d, c)`.
pub const CUSTOMER: u8 = 12;
/// HISTORY `(w, d, origin, seq)`.
pub const HISTORY: u8 = 13;
/// NEW-ORDER `(w, d, o)`; the value is empty.
pub const NEW_ORDER: u8 = 14;
/// ORDER `(w, d, o)`.
pub const ORDER: u8 = 15;
/// ORDER-LINE `(w, d, o, number)`.
pub const ORDER_LINE: u8 = 16;
/// STOCK `(w, i)`.
pub const STOCK: u8 = 17;
/// ITEM `(i)`, replicated on every shard, read-only.
pub const ITEM: u8 = 18;
/// ORDER_CUST `(w, d, c, o)`: an index from customer to orders; the value is empty.
pub const ORDER_CUST: u8 = 19;

/// Key of a warehouse.
pub fn warehouse_key(w: u64) -> Key {
    Key::table(WAREHOUSE).u64(w).build()
}
/// Key of a district.
pub fn district_key(w: u64, d: u64) -> Key {
    Key::table(DISTRICT).u64(w).u64(d).build()
}
/// Key of a customer.
pub fn customer_key(w: u64, d: u64, c: u64) -> Key {
    Key::table(CUSTOMER).u64(w).u64(d).u64(c).build()
}
/// Key of a history row.
pub fn history_key(w: u64, d: u64, origin: u64, seq: u64) -> Key {
    Key::table(HISTORY).u64(w).u64(d).u64(origin).u64(seq).build()
}
/// Key of a new-order row.
pub fn new_order_key(w: u64, d: u64, o: u64) -> Key {
    Key::table(NEW_ORDER).u64(w).u64(d).u64(o).build()
}
/// Key of an order.
pub fn order_key(w: u64, d: u64, o: u64) -> Key {
    Key::table(ORDER).u64(w).u64(d).u64(o).build()
}
/// Key of an order line.
pub fn order_line_key(w: u64, d: u64, o: u64, number: u64) -> Key {
    Key::table(ORDER_LINE).u64(w).u64(d).u64(o).u64(number).build()
}
/// Key of a stock row.
pub fn stock_key(w: u64, i: u64) -> Key {
    Key::table(STOCK).u64(w).u64(i).build()
}
/// Key of an item.
pub fn item_key(i: u64) -> Key {
    Key::table(ITEM).u64(i).build()
}
/// Key of an order-by-customer index entry.
pub fn order_cust_key(w: u64, d: u64, c: u64, o: u64) -> Key {
    Key::table(ORDER_CUST).u64(w).u64(d).u64(c).u64(o).build()
}

/// The first key after every key that starts with `prefix` (a key built of whole components).
pub fn after_prefix(prefix: Key) -> Key {
    meridian_core::key::prefix_end(prefix.as_bytes()).expect("TPC-C prefixes are not all 0xFF")
}

/// The components of a key after its table byte, as `u64`s (every TPC-C key is made of them).
pub fn key_ids<const N: usize>(key: &Key) -> Option<[u64; N]> {
    let mut reader = key.reader();
    let mut ids = [0; N];
    for id in &mut ids {
        *id = reader.u64().ok()?;
    }
    reader.is_empty().then_some(ids)
}

/// A row that knows how to encode itself.
pub trait Row: Serialize + DeserializeOwned {
    /// The table name, for messages.
    const TABLE: &'static str;

    /// The encoded value.
    fn encode(&self) -> Value {
        postcard::to_allocvec(self).expect("rows always encode")
    }

    /// Decodes a value; a message naming the table when it does not decode.
    fn decode(value: Option<&[u8]>) -> Result<Self, String> {
        let bytes = value.ok_or_else(|| format!("{} row is missing", Self::TABLE))?;
        postcard::from_bytes(bytes).map_err(|e| format!("{} row does not decode: {e}", Self::TABLE))
    }
}

/// A street address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// 10..20 characters.
    pub street_1: String,
    /// 10..20 characters.
    pub street_2: String,
    /// 10..20 characters.
    pub city: String,
    /// 2 characters.
    pub state: String,
    /// 9 characters.
    pub zip: String,
}

/// WAREHOUSE.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warehouse {
    /// W_NAME.
    pub name: String,
    /// W_STREET_1 .. W_ZIP.
    pub address: Address,
    /// W_TAX in 1/10,000.
    pub tax: u32,
    /// W_YTD in cents.
    pub ytd_cents: i64,
}
impl Row for Warehouse {
    const TABLE: &'static str = "WAREHOUSE";
}

/// DISTRICT.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct District {
    /// D_NAME.
    pub name: String,
    /// D_STREET_1 .. D_ZIP.
    pub address: Address,
    /// D_TAX in 1/10,000.
    pub tax: u32,
    /// D_YTD in cents.
    pub ytd_cents: i64,
    /// D_NEXT_O_ID.
    pub next_o_id: u64,
}
impl Row for District {
    const TABLE: &'static str = "DISTRICT";
}

/// CUSTOMER.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Customer {
    /// C_FIRST.
    pub first: String,
    /// C_MIDDLE ("OE").
    pub middle: String,
    /// C_LAST.
    pub last: String,
    /// C_STREET_1 .. C_ZIP.
    pub address: Address,
    /// C_PHONE.
    pub phone: String,
    /// C_SINCE.
    pub since: u64,
    /// C_CREDIT: "GC" or "BC".
    pub credit: String,
    /// C_CREDIT_LIM in cents.
    pub credit_lim_cents: i64,
    /// C_DISCOUNT in 1/10,000.
    pub discount: u32,
    /// C_BALANCE in cents.
    pub balance_cents: i64,
    /// C_YTD_PAYMENT in cents.
    pub ytd_payment_cents: i64,
    /// C_PAYMENT_CNT.
    pub payment_cnt: u32,
    /// C_DELIVERY_CNT.
    pub delivery_cnt: u32,
    /// C_DATA, 300..500 characters.
    pub data: String,
}
impl Row for Customer {
    const TABLE: &'static str = "CUSTOMER";
}

/// HISTORY.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// H_C_ID.
    pub c_id: u64,
    /// H_C_D_ID.
    pub c_d_id: u64,
    /// H_C_W_ID.
    pub c_w_id: u64,
    /// H_D_ID.
    pub d_id: u64,
    /// H_W_ID.
    pub w_id: u64,
    /// H_DATE.
    pub date: u64,
    /// H_AMOUNT in cents.
    pub amount_cents: i64,
    /// H_DATA.
    pub data: String,
}
impl Row for History {
    const TABLE: &'static str = "HISTORY";
}

/// ORDER.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// O_C_ID.
    pub c_id: u64,
    /// O_ENTRY_D.
    pub entry_d: u64,
    /// O_CARRIER_ID; `None` is NULL (not delivered).
    pub carrier_id: Option<u64>,
    /// O_OL_CNT.
    pub ol_cnt: u64,
    /// O_ALL_LOCAL.
    pub all_local: bool,
}
impl Row for Order {
    const TABLE: &'static str = "ORDER";
}

/// ORDER-LINE.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    /// OL_I_ID.
    pub i_id: u64,
    /// OL_SUPPLY_W_ID.
    pub supply_w_id: u64,
    /// OL_DELIVERY_D; `None` is NULL.
    pub delivery_d: Option<u64>,
    /// OL_QUANTITY.
    pub quantity: u64,
    /// OL_AMOUNT in cents.
    pub amount_cents: i64,
    /// OL_DIST_INFO, 24 characters.
    pub dist_info: String,
}
impl Row for OrderLine {
    const TABLE: &'static str = "ORDER-LINE";
}

/// STOCK.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    /// S_QUANTITY.
    pub quantity: i64,
    /// S_DIST_01 .. S_DIST_10, 24 characters each.
    pub dist: Vec<String>,
    /// S_YTD.
    pub ytd: i64,
    /// S_ORDER_CNT.
    pub order_cnt: u64,
    /// S_REMOTE_CNT.
    pub remote_cnt: u64,
    /// S_DATA.
    pub data: String,
}
impl Row for Stock {
    const TABLE: &'static str = "STOCK";
}

/// ITEM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// I_IM_ID.
    pub im_id: u64,
    /// I_NAME.
    pub name: String,
    /// I_PRICE in cents.
    pub price_cents: i64,
    /// I_DATA.
    pub data: String,
}
impl Row for Item {
    const TABLE: &'static str = "ITEM";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_their_components_and_decode() {
        let a = order_line_key(1, 2, 3, 4);
        let b = order_line_key(1, 2, 10, 1);
        assert!(a < b);
        assert_eq!(key_ids::<4>(&a), Some([1, 2, 3, 4]));
        assert_eq!(key_ids::<3>(&a), None, "a key with more components is not a 3-id key");
        let district = Key::table(ORDER_LINE).u64(1).u64(2).build();
        assert!(district < a && a < after_prefix(district.clone()));
        assert!(after_prefix(district) < order_line_key(1, 3, 0, 0));
    }

    #[test]
    fn rows_round_trip_and_bad_bytes_are_named() {
        let order = Order { c_id: 7, entry_d: 1, carrier_id: None, ol_cnt: 5, all_local: true };
        assert_eq!(Order::decode(Some(&order.encode())), Ok(order));
        assert!(Order::decode(None).unwrap_err().contains("ORDER row is missing"));
        assert!(Stock::decode(Some(&[0xFF; 3])).unwrap_err().contains("STOCK"));
    }
}
