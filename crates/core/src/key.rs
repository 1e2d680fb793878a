//! Order-preserving key encoding.
//!
//! A key is bytes. Composite keys are a one-byte table id followed by components, each encoded
//! so that byte order equals component order:
//! - unsigned integers: big-endian, fixed width;
//! - signed integers: big-endian with the sign bit flipped, so negatives sort first;
//! - byte strings: every `0x00` becomes `0x00 0xFF`, and the string ends with `0x00 0x01`. A
//!   prefix then sorts before its extensions, and the terminator never occurs inside.
//!
//! Invariant: for two tuples of the same table and component types, `a < b` as tuples exactly
//! when `encode(a) < encode(b)` as bytes. The tests check it on random tuples.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

/// Keys of at most this many bytes are kept inside the key itself, without an allocation: a
/// table byte and two 64-bit components (17 bytes) fit, which covers the keys of every
/// workload but TPC-C's. Chosen so that a key is as large as a `Vec<u8>` (24 bytes).
pub const KEY_INLINE_MAX: usize = 22;

/// A key: its bytes.
///
/// Keys are cloned into every ordered map and message that names them, and compared on every
/// lookup there, so a short key lives inline: cloning it copies 24 bytes instead of
/// allocating, and comparing it reads no second cache line. Equality, order, hashing and the
/// serialized form are those of the bytes (the same as a `Vec<u8>`'s), whatever the
/// representation.
#[derive(Clone, Default)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    /// At most [`KEY_INLINE_MAX`] bytes: the first `len` of `bytes`, the rest zero.
    Inline { len: u8, bytes: [u8; KEY_INLINE_MAX] },
    /// More than [`KEY_INLINE_MAX`] bytes (only then: one form per key).
    Heap(Box<[u8]>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Inline { len: 0, bytes: [0; KEY_INLINE_MAX] }
    }
}

const _: () = assert!(KEY_INLINE_MAX <= u8::MAX as usize);
const _: () = assert!(std::mem::size_of::<Key>() == std::mem::size_of::<Vec<u8>>());

/// A value: its bytes. Money and counters are integers encoded by the workload.
pub type Value = Vec<u8>;

impl Key {
    /// Starts a key of `table`.
    pub fn table(table: u8) -> KeyBuilder {
        KeyBuilder::new(table)
    }

    /// The key whose bytes are `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        if bytes.len() <= KEY_INLINE_MAX {
            let mut inline = [0; KEY_INLINE_MAX];
            inline[..bytes.len()].copy_from_slice(bytes);
            Key(Repr::Inline { len: bytes.len() as u8, bytes: inline })
        } else {
            Key(Repr::Heap(bytes.into()))
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Heap(bytes) => bytes,
        }
    }

    /// The bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        match self.0 {
            Repr::Inline { .. } => self.as_bytes().to_vec(),
            Repr::Heap(bytes) => bytes.into_vec(),
        }
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// True for the empty key.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// The table id (first byte), if any.
    pub fn table_id(&self) -> Option<u8> {
        self.as_bytes().first().copied()
    }

    /// A reader over the components after the table byte.
    pub fn reader(&self) -> KeyReader<'_> {
        KeyReader { rest: self.as_bytes().get(1..).unwrap_or(&[]) }
    }
}

impl From<Vec<u8>> for Key {
    fn from(bytes: Vec<u8>) -> Self {
        if bytes.len() <= KEY_INLINE_MAX {
            Key::from_slice(&bytes)
        } else {
            Key(Repr::Heap(bytes.into_boxed_slice()))
        }
    }
}

impl From<&[u8]> for Key {
    fn from(bytes: &[u8]) -> Self {
        Key::from_slice(bytes)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As a `Vec<u8>` hashes: digests of keys stay what they were.
        self.as_bytes().hash(state);
    }
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // As a `Vec<u8>` serializes (a sequence of bytes): journals, logs and the wire keep
        // their format.
        serializer.collect_seq(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<u8>::deserialize(deserializer).map(Key::from)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("k")?;
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Builds a composite key component by component. A key that fits inline is built without
/// an allocation; one that outgrows it moves to the heap once.
#[derive(Clone, Debug)]
pub struct KeyBuilder {
    inline: [u8; KEY_INLINE_MAX],
    len: usize,
    /// Every byte once the key outgrew `inline`; empty (unallocated) until then.
    spilled: Vec<u8>,
}

impl KeyBuilder {
    fn new(table: u8) -> Self {
        let mut inline = [0; KEY_INLINE_MAX];
        inline[0] = table;
        Self { inline, len: 1, spilled: Vec::new() }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() && self.len + bytes.len() <= KEY_INLINE_MAX {
            self.inline[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
            return;
        }
        if self.spilled.is_empty() {
            self.spilled.reserve(2 * KEY_INLINE_MAX);
            self.spilled.extend_from_slice(&self.inline[..self.len]);
        }
        self.spilled.extend_from_slice(bytes);
    }

    /// Appends an unsigned 64-bit integer.
    pub fn u64(mut self, value: u64) -> Self {
        self.push(&value.to_be_bytes());
        self
    }

    /// Appends an unsigned 32-bit integer.
    pub fn u32(mut self, value: u32) -> Self {
        self.push(&value.to_be_bytes());
        self
    }

    /// Appends a signed 64-bit integer.
    pub fn i64(mut self, value: i64) -> Self {
        let flipped = (value as u64) ^ (1u64 << 63);
        self.push(&flipped.to_be_bytes());
        self
    }

    /// Appends a byte string (escaped, terminated).
    pub fn bytes(mut self, value: &[u8]) -> Self {
        for &byte in value {
            if byte == 0 {
                self.push(&[0x00, 0xFF]);
            } else {
                self.push(&[byte]);
            }
        }
        self.push(&[0x00, 0x01]);
        self
    }

    /// Appends a UTF-8 string as a byte string.
    pub fn str(self, value: &str) -> Self {
        self.bytes(value.as_bytes())
    }

    /// Finishes the key.
    pub fn build(self) -> Key {
        if self.spilled.is_empty() {
            Key::from_slice(&self.inline[..self.len])
        } else {
            Key::from(self.spilled)
        }
    }
}

/// Why a key could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyDecodeError {
    /// Fewer bytes left than the component needs.
    Truncated,
    /// A byte string with a bad escape or no terminator.
    BadEscape,
}

/// Reads components back in the order they were built.
#[derive(Clone, Debug)]
pub struct KeyReader<'a> {
    rest: &'a [u8],
}

impl<'a> KeyReader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], KeyDecodeError> {
        let (head, tail) = self.rest.split_at_checked(N).ok_or(KeyDecodeError::Truncated)?;
        self.rest = tail;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }

    /// Reads an unsigned 64-bit integer.
    pub fn u64(&mut self) -> Result<u64, KeyDecodeError> {
        Ok(u64::from_be_bytes(self.take::<8>()?))
    }

    /// Reads an unsigned 32-bit integer.
    pub fn u32(&mut self) -> Result<u32, KeyDecodeError> {
        Ok(u32::from_be_bytes(self.take::<4>()?))
    }

    /// Reads a signed 64-bit integer.
    pub fn i64(&mut self) -> Result<i64, KeyDecodeError> {
        Ok((u64::from_be_bytes(self.take::<8>()?) ^ (1u64 << 63)) as i64)
    }

    /// Reads a byte string.
    pub fn bytes(&mut self) -> Result<Vec<u8>, KeyDecodeError> {
        let mut out = Vec::new();
        let mut index = 0;
        // Bounded by the key length: each step consumes at least one byte.
        while index < self.rest.len() {
            let byte = self.rest[index];
            if byte != 0 {
                out.push(byte);
                index += 1;
                continue;
            }
            match self.rest.get(index + 1) {
                Some(0xFF) => {
                    out.push(0);
                    index += 2;
                }
                Some(0x01) => {
                    self.rest = &self.rest[index + 2..];
                    return Ok(out);
                }
                _ => return Err(KeyDecodeError::BadEscape),
            }
        }
        Err(KeyDecodeError::BadEscape)
    }

    /// True when every component has been read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// The smallest key strictly greater than every key that starts with `prefix`, or `None` when
/// no such key exists (prefix of all `0xFF`). Used for prefix scans.
pub fn prefix_end(prefix: &[u8]) -> Option<Key> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last != 0xFF {
            end.push(last + 1);
            return Some(Key::from(end));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{child_rng, uniform_u64};

    /// Short keys live inline and long ones on the heap; either way a key compares, hashes
    /// and serializes exactly as its bytes in a `Vec<u8>` do, across the boundary.
    #[test]
    fn a_key_behaves_as_its_bytes_inline_or_not() {
        use std::hash::BuildHasher;
        let hasher = std::hash::BuildHasherDefault::<crate::hash::FnvHasher>::default();
        let mut rng = child_rng(11, "key-repr", 0);
        let mut samples: Vec<Vec<u8>> = Vec::new();
        for len in 0..=2 * KEY_INLINE_MAX {
            for _ in 0..4 {
                // Few distinct byte values, so equal prefixes and equal keys are common.
                samples.push((0..len).map(|_| uniform_u64(&mut rng, 3) as u8).collect());
            }
        }
        for bytes in &samples {
            let key = Key::from(bytes.clone());
            assert_eq!(key.as_bytes(), &bytes[..]);
            assert_eq!(key.len(), bytes.len());
            assert_eq!(key, Key::from_slice(bytes));
            assert_eq!(key.clone().into_bytes(), *bytes);
            assert_eq!(matches!(key.0, Repr::Inline { .. }), bytes.len() <= KEY_INLINE_MAX);
            assert_eq!(hasher.hash_one(&key), hasher.hash_one(bytes), "hash of {bytes:?}");
            let wire = postcard::to_allocvec(&key).unwrap();
            assert_eq!(wire, postcard::to_allocvec(bytes).unwrap(), "wire form of {bytes:?}");
            assert_eq!(postcard::from_bytes::<Key>(&wire).unwrap(), key);
            for other in &samples {
                let other_key = Key::from_slice(other);
                assert_eq!(key.cmp(&other_key), bytes.cmp(other), "{bytes:?} against {other:?}");
                assert_eq!(key == other_key, bytes == other);
            }
        }
        assert_eq!(Key::default(), Key::from(Vec::new()));
        assert!(postcard::from_bytes::<Key>(&[5, 1, 2]).is_err(), "a truncated key is refused");
    }

    /// The builder gives the same bytes whether the key stays inline or outgrows it midway
    /// through a component.
    #[test]
    fn the_builder_spills_to_the_heap_without_changing_a_byte() {
        for count in 0..6u64 {
            for text in ["", "a\0b", "a longer string than fits inline"] {
                let mut expected = vec![9u8];
                let mut builder = Key::table(9);
                for i in 0..count {
                    expected.extend_from_slice(&(i * 77).to_be_bytes());
                    builder = builder.u64(i * 77);
                }
                for &byte in text.as_bytes() {
                    expected.push(byte);
                    if byte == 0 {
                        expected.push(0xFF);
                    }
                }
                expected.extend_from_slice(&[0, 1]);
                builder = builder.str(text);
                expected.extend_from_slice(&7u32.to_be_bytes());
                let key = builder.u32(7).build();
                assert_eq!(key.as_bytes(), &expected[..], "{count} integers, {text:?}");
                assert_eq!(matches!(key.0, Repr::Inline { .. }), expected.len() <= KEY_INLINE_MAX);
            }
        }
    }

    #[test]
    fn integers_round_trip_and_keep_order() {
        let values = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys: Vec<Key> = values.iter().map(|&v| Key::table(3).i64(v).build()).collect();
        for pair in keys.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?}", pair[0], pair[1]);
        }
        for (key, &value) in keys.iter().zip(&values) {
            let mut reader = key.reader();
            assert_eq!(reader.i64(), Ok(value));
            assert!(reader.is_empty());
        }
        let key = Key::table(1).u64(9).u32(4).build();
        let mut reader = key.reader();
        assert_eq!((reader.u64(), reader.u32()), (Ok(9), Ok(4)));
        assert_eq!(key.table_id(), Some(1));
    }

    #[test]
    fn byte_strings_keep_order_with_zeros_and_prefixes() {
        let strings: [&[u8]; 6] = [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"a", b"ab"];
        let keys: Vec<Key> =
            strings.iter().map(|s| Key::table(0).bytes(s).u64(1).build()).collect();
        for pair in keys.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?}", pair[0], pair[1]);
        }
        for (key, s) in keys.iter().zip(strings) {
            let mut reader = key.reader();
            assert_eq!(reader.bytes().as_deref(), Ok(s));
            assert_eq!(reader.u64(), Ok(1));
        }
    }

    #[test]
    fn random_tuples_order_equals_byte_order() {
        let mut rng = child_rng(42, "key-order", 0);
        let mut tuples: Vec<(u64, Vec<u8>, i64)> = Vec::new();
        for _ in 0..2_000 {
            let len = uniform_u64(&mut rng, 4) as usize;
            let text: Vec<u8> = (0..len).map(|_| uniform_u64(&mut rng, 3) as u8).collect();
            let signed = uniform_u64(&mut rng, 7) as i64 - 3;
            tuples.push((uniform_u64(&mut rng, 3), text, signed));
        }
        let encode = |t: &(u64, Vec<u8>, i64)| Key::table(7).u64(t.0).bytes(&t.1).i64(t.2).build();
        for pair in tuples.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert_eq!(a.cmp(b), encode(a).cmp(&encode(b)), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn malformed_components_are_errors() {
        let (short, unterminated, bad) =
            (Key::from(vec![1, 0, 0]), Key::from(vec![1, b'a', 0]), Key::from(vec![1, 0, 7]));
        assert_eq!(short.reader().u64(), Err(KeyDecodeError::Truncated));
        assert_eq!(unterminated.reader().bytes(), Err(KeyDecodeError::BadEscape));
        assert_eq!(bad.reader().bytes(), Err(KeyDecodeError::BadEscape));
    }

    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(&[1, 2]), Some(Key::from(vec![1, 3])));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(Key::from(vec![2])));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
