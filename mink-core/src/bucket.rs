//! Bucketing: which of a table's `N` buckets a row belongs to.
//!
//! A mink table is split into a fixed number of buckets by its bucket key
//! (one or more columns). Every row of a key lands in the same bucket, so
//! writes, merges and lookups for a key touch one bucket only.
//!
//! The function is Apache Iceberg's `bucket[N]` transform (Iceberg table spec,
//! "Bucket Transform Details" and Appendix B "32-bit Hash Requirements"):
//!
//! ```text
//! bucket = (murmur3_x86_32(serialize(value), seed 0) & i32::MAX) % N
//! ```
//!
//! where `serialize` is Iceberg's single-value serialization for hashing:
//!
//! | Iceberg type          | Arrow types                                   | bytes hashed                                   |
//! |-----------------------|-----------------------------------------------|------------------------------------------------|
//! | int, long             | Int8/16/32/64, UInt8/16/32                    | value widened to `i64`, 8 bytes little-endian  |
//! | date                  | Date32 (Date64 is floored to days)            | day count as `i64` LE                          |
//! | time                  | Time32/Time64, any unit                       | microseconds of the day as `i64` LE            |
//! | timestamp(tz), ns too | Timestamp, any unit, any zone                 | microseconds since epoch (floored) as `i64` LE |
//! | string                | Utf8, LargeUtf8, Utf8View                     | UTF-8 bytes                                    |
//! | binary, fixed, uuid   | Binary, LargeBinary, BinaryView, FixedSizeBinary | raw bytes (a uuid as its 16 big-endian bytes) |
//! | decimal               | Decimal32/64/128                              | unscaled value, minimal big-endian two's complement |
//!
//! Boolean, floats, UInt64, dictionaries and other types are rejected with
//! [`BucketError::UnsupportedType`]: Iceberg does not define a bucket hash
//! for them (UInt64 does not fit Iceberg's `long`).
//!
//! With a single key column the result is exactly Iceberg's `bucket[N]`, so an
//! Iceberg engine reading the lake tier can prune files by key. A null key
//! goes to bucket 0 (Iceberg's transform leaves nulls null; mink needs a bucket).
//!
//! With several key columns, Iceberg has no multi-column bucket transform, so
//! mink hashes the concatenation, for each column in order, of the value's
//! 4-byte little-endian length followed by its serialization (a null is the
//! length `0xFFFF_FFFF` and no bytes), then applies `& i32::MAX) % N`. The
//! length prefixes keep `("ab", "c")` and `("a", "bc")` apart.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal32Type, Decimal64Type,
    Decimal128Type, Int8Type, Int16Type, Int32Type, Int64Type, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type,
};

/// Iceberg's 32-bit hash: MurmurHash3 x86 32-bit with seed 0, as a signed `i32`
/// (the value Java's `Hashing.murmur3_32_fixed().hashBytes(..).asInt()` returns).
pub fn murmur3_32(data: &[u8]) -> i32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;

    let mut h: u32 = 0;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k: u32 = 0;
        for (i, &b) in tail.iter().enumerate() {
            k |= u32::from(b) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    // Iceberg values are far below 4 GiB; the length is mixed in modulo 2^32.
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h as i32
}

/// Why a set of key columns cannot be bucketed.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// A column type mink cannot bucket by (Iceberg defines no bucket hash for it).
    #[error("cannot bucket by a column of type {0}")]
    UnsupportedType(DataType),
    /// No key column was given.
    #[error("bucketing needs at least one key column")]
    NoColumns,
    /// The table was given zero buckets.
    #[error("the number of buckets must be at least 1")]
    ZeroBuckets,
    /// Key columns have different row counts.
    #[error("key column {column} has {actual} rows, expected {expected}")]
    LengthMismatch {
        /// Index of the offending column in the key.
        column: usize,
        /// Row count of the first key column.
        expected: usize,
        /// Row count of the offending column.
        actual: usize,
    },
}

/// Returns the bucket in `0..num_buckets` of every row of the key `columns`.
///
/// - One column: `(murmur3_32(serialize(value)) & i32::MAX) % num_buckets`,
///   exactly Iceberg's `bucket[num_buckets]` transform. A null goes to bucket 0.
/// - Several columns: the hash of the concatenation, column by column, of a
///   4-byte little-endian length and the value's serialization (a null is the
///   length `0xFFFF_FFFF` with no bytes), then `& i32::MAX) % num_buckets`.
///
/// See the module documentation for the serialization of each type.
pub fn bucket_of_rows(columns: &[ArrayRef], num_buckets: u32) -> Result<Vec<u32>, BucketError> {
    if num_buckets == 0 {
        return Err(BucketError::ZeroBuckets);
    }
    let first = columns.first().ok_or(BucketError::NoColumns)?;
    let rows = first.len();
    let keys = columns
        .iter()
        .enumerate()
        .map(|(column, array)| {
            if array.len() != rows {
                return Err(BucketError::LengthMismatch {
                    column,
                    expected: rows,
                    actual: array.len(),
                });
            }
            KeyColumn::new(array.as_ref())
        })
        .collect::<Result<Vec<_>, _>>()?;

    let bucket = |hash: i32| (hash & i32::MAX) as u32 % num_buckets;
    let mut stack = [0u8; 16];
    let mut out = Vec::with_capacity(rows);
    if let [key] = keys.as_slice() {
        for row in 0..rows {
            out.push(
                key.bytes(row, &mut stack)
                    .map_or(0, |b| bucket(murmur3_32(b))),
            );
        }
    } else {
        let mut scratch = Vec::with_capacity(64);
        for row in 0..rows {
            scratch.clear();
            for key in &keys {
                match key.bytes(row, &mut stack) {
                    Some(b) => {
                        scratch.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        scratch.extend_from_slice(b);
                    }
                    None => scratch.extend_from_slice(&u32::MAX.to_le_bytes()),
                }
            }
            out.push(bucket(murmur3_32(&scratch)));
        }
    }
    Ok(out)
}

/// A key column downcast once to its typed array, read row by row.
struct KeyColumn<'a> {
    nulls: Option<&'a NullBuffer>,
    value: Value<'a>,
}

/// How a column's value at a row turns into Iceberg's hash input.
enum Value<'a> {
    /// int, long, date, time, timestamp: the value as `i64`, hashed as 8 bytes LE.
    Long(Box<dyn Fn(usize) -> i64 + 'a>),
    /// decimal: the unscaled value, hashed as minimal big-endian two's complement.
    Decimal(Box<dyn Fn(usize) -> i128 + 'a>),
    /// string, binary, fixed, uuid: the bytes themselves.
    Bytes(Box<dyn Fn(usize) -> &'a [u8] + 'a>),
}

/// `Value::Long` reading a primitive column of type `T` through `f`.
fn long<'a, T: ArrowPrimitiveType>(
    array: &'a dyn Array,
    f: impl Fn(T::Native) -> i64 + 'a,
) -> Value<'a> {
    let values = array.as_primitive::<T>().values();
    Value::Long(Box::new(move |row| f(values[row])))
}

/// `Value::Decimal` reading a decimal column of type `T`.
fn decimal<'a, T: ArrowPrimitiveType>(array: &'a dyn Array) -> Value<'a>
where
    T::Native: Into<i128>,
{
    let values = array.as_primitive::<T>().values();
    Value::Decimal(Box::new(move |row| values[row].into()))
}

impl<'a> KeyColumn<'a> {
    fn new(array: &'a dyn Array) -> Result<Self, BucketError> {
        use TimeUnit::*;
        let a = array;
        let value = match a.data_type() {
            DataType::Int8 => long::<Int8Type>(a, i64::from),
            DataType::Int16 => long::<Int16Type>(a, i64::from),
            DataType::Int32 => long::<Int32Type>(a, i64::from),
            DataType::Int64 => long::<Int64Type>(a, |v| v),
            DataType::UInt8 => long::<UInt8Type>(a, i64::from),
            DataType::UInt16 => long::<UInt16Type>(a, i64::from),
            DataType::UInt32 => long::<UInt32Type>(a, i64::from),
            DataType::Date32 => long::<Date32Type>(a, i64::from),
            DataType::Date64 => long::<Date64Type>(a, |ms| ms.div_euclid(86_400_000)),
            DataType::Time32(Second) => long::<Time32SecondType>(a, |s| i64::from(s) * 1_000_000),
            DataType::Time32(Millisecond) => {
                long::<Time32MillisecondType>(a, |ms| i64::from(ms) * 1_000)
            }
            DataType::Time64(Microsecond) => long::<Time64MicrosecondType>(a, |us| us),
            DataType::Time64(Nanosecond) => {
                long::<Time64NanosecondType>(a, |ns| ns.div_euclid(1_000))
            }
            // Out-of-range seconds/millis (beyond ±292,000 years) wrap; Iceberg cannot store them anyway.
            DataType::Timestamp(Second, _) => {
                long::<TimestampSecondType>(a, |s| s.wrapping_mul(1_000_000))
            }
            DataType::Timestamp(Millisecond, _) => {
                long::<TimestampMillisecondType>(a, |ms| ms.wrapping_mul(1_000))
            }
            DataType::Timestamp(Microsecond, _) => long::<TimestampMicrosecondType>(a, |us| us),
            DataType::Timestamp(Nanosecond, _) => {
                long::<TimestampNanosecondType>(a, |ns| ns.div_euclid(1_000))
            }
            DataType::Decimal32(..) => decimal::<Decimal32Type>(a),
            DataType::Decimal64(..) => decimal::<Decimal64Type>(a),
            DataType::Decimal128(..) => decimal::<Decimal128Type>(a),
            DataType::Utf8 => {
                let s = a.as_string::<i32>();
                Value::Bytes(Box::new(move |row| s.value(row).as_bytes()))
            }
            DataType::LargeUtf8 => {
                let s = a.as_string::<i64>();
                Value::Bytes(Box::new(move |row| s.value(row).as_bytes()))
            }
            DataType::Utf8View => {
                let s = a.as_string_view();
                Value::Bytes(Box::new(move |row| s.value(row).as_bytes()))
            }
            DataType::Binary => {
                let b = a.as_binary::<i32>();
                Value::Bytes(Box::new(move |row| b.value(row)))
            }
            DataType::LargeBinary => {
                let b = a.as_binary::<i64>();
                Value::Bytes(Box::new(move |row| b.value(row)))
            }
            DataType::BinaryView => {
                let b = a.as_binary_view();
                Value::Bytes(Box::new(move |row| b.value(row)))
            }
            DataType::FixedSizeBinary(_) => {
                let b = a.as_fixed_size_binary();
                Value::Bytes(Box::new(move |row| b.value(row)))
            }
            other => return Err(BucketError::UnsupportedType(other.clone())),
        };
        Ok(Self {
            nulls: a.nulls(),
            value,
        })
    }

    /// The hash input of `row`, or `None` for a null. Fixed-width values are
    /// written to `stack`; strings and binaries borrow the array's buffer.
    fn bytes<'s>(&'s self, row: usize, stack: &'s mut [u8; 16]) -> Option<&'s [u8]> {
        if self.nulls.is_some_and(|n| n.is_null(row)) {
            return None;
        }
        Some(match &self.value {
            Value::Long(f) => {
                stack[..8].copy_from_slice(&f(row).to_le_bytes());
                &stack[..8]
            }
            Value::Decimal(f) => decimal_bytes(f(row), stack),
            Value::Bytes(f) => f(row),
        })
    }
}

/// Writes `v` as Java's `BigInteger.toByteArray()`: the shortest big-endian
/// two's-complement form that keeps the sign bit (at least one byte).
fn decimal_bytes(v: i128, stack: &mut [u8; 16]) -> &[u8] {
    *stack = v.to_be_bytes();
    let mut start = 0;
    while start < 15 {
        let (byte, next) = (stack[start], stack[start + 1]);
        if (byte == 0x00 && next & 0x80 == 0) || (byte == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    &stack[start..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BinaryArray, BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray,
        Float64Array, Int32Array, Int64Array, StringArray, Time64MicrosecondArray,
        TimestampMicrosecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt64Array,
    };
    use std::sync::Arc;

    /// f79c3e09-677c-4bbd-a479-3f349cb785e7, the uuid of the spec's Appendix B table.
    const UUID: [u8; 16] = [
        0xf7, 0x9c, 0x3e, 0x09, 0x67, 0x7c, 0x4b, 0xbd, 0xa4, 0x79, 0x3f, 0x34, 0x9c, 0xb7, 0x85,
        0xe7,
    ];
    const DAY: i32 = 17486; // 2017-11-16
    const TIME_US: i64 = 81_068_000_000; // 22:31:08
    const TS_S: i64 = 1_510_871_468; // 2017-11-16T22:31:08Z == 2017-11-16T14:31:08-08:00

    /// The hash of row 0's serialization, to compare with the spec's published values.
    fn hash_of(array: ArrayRef) -> i32 {
        let key = KeyColumn::new(array.as_ref()).unwrap();
        let mut stack = [0u8; 16];
        murmur3_32(key.bytes(0, &mut stack).unwrap())
    }

    #[test]
    fn murmur3_spec_vectors() {
        assert_eq!(murmur3_32(&34i64.to_le_bytes()), 2017239379);
        assert_eq!(murmur3_32(&[0x05, 0x8c]), -500754589);
        assert_eq!(murmur3_32(&i64::from(DAY).to_le_bytes()), -653330422);
        assert_eq!(murmur3_32(&TIME_US.to_le_bytes()), -662762989);
        assert_eq!(murmur3_32(&(TS_S * 1_000_000).to_le_bytes()), -2047944441);
        assert_eq!(murmur3_32(b"iceberg"), 1210000089);
        assert_eq!(murmur3_32(&UUID), 1488055340);
        assert_eq!(murmur3_32(&[0, 1, 2, 3]), -188683207);
        assert_eq!(murmur3_32(b""), 0);
    }

    #[test]
    fn column_serialization_matches_spec() {
        let tz = "-08:00";
        let cases: Vec<(ArrayRef, i32)> = vec![
            (Arc::new(Int32Array::from(vec![34])), 2017239379),
            (Arc::new(Int64Array::from(vec![34])), 2017239379),
            (
                Arc::new(
                    Decimal128Array::from(vec![1420])
                        .with_precision_and_scale(9, 2)
                        .unwrap(),
                ),
                -500754589,
            ),
            (Arc::new(Date32Array::from(vec![DAY])), -653330422),
            (
                Arc::new(Time64MicrosecondArray::from(vec![TIME_US])),
                -662762989,
            ),
            (
                Arc::new(TimestampMicrosecondArray::from(vec![TS_S * 1_000_000])),
                -2047944441,
            ),
            (
                Arc::new(TimestampSecondArray::from(vec![TS_S]).with_timezone(tz)),
                -2047944441,
            ),
            (
                Arc::new(
                    TimestampNanosecondArray::from(vec![TS_S * 1_000_000_000 + 999])
                        .with_timezone(tz),
                ),
                -2047944441,
            ),
            (Arc::new(StringArray::from(vec!["iceberg"])), 1210000089),
            (
                Arc::new(FixedSizeBinaryArray::try_from_iter([UUID].into_iter()).unwrap()),
                1488055340,
            ),
            (
                Arc::new(BinaryArray::from(vec![&[0u8, 1, 2, 3][..]])),
                -188683207,
            ),
        ];
        for (array, expected) in cases {
            let ty = array.data_type().clone();
            assert_eq!(hash_of(array), expected, "{ty}");
        }
    }

    #[test]
    fn decimal_minimal_bytes_and_nanos_floor() {
        let mut s = [0u8; 16];
        assert_eq!(decimal_bytes(0, &mut s), [0x00]);
        assert_eq!(decimal_bytes(-1, &mut s), [0xff]);
        assert_eq!(decimal_bytes(128, &mut s), [0x00, 0x80]);
        assert_eq!(decimal_bytes(-128, &mut s), [0x80]);
        assert_eq!(decimal_bytes(-129, &mut s), [0xff, 0x7f]);
        assert_eq!(decimal_bytes(i128::MIN, &mut s).len(), 16);
        let ns: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![-1]));
        assert_eq!(hash_of(ns), murmur3_32(&(-1i64).to_le_bytes()));
    }

    #[test]
    fn single_column_buckets() {
        let values = [34, 0, -1, 1_000_000, i32::MIN];
        let n = 16;
        let expected: Vec<u32> = values
            .iter()
            .map(|v| (murmur3_32(&i64::from(*v).to_le_bytes()) & i32::MAX) as u32 % n)
            .collect();
        assert_eq!(expected[0], 3); // 2017239379 % 16
        let i32s: ArrayRef = Arc::new(Int32Array::from(values.to_vec()));
        let i64s: ArrayRef = Arc::new(Int64Array::from(
            values.iter().map(|v| i64::from(*v)).collect::<Vec<_>>(),
        ));
        assert_eq!(bucket_of_rows(&[i32s], n).unwrap(), expected);
        assert_eq!(bucket_of_rows(&[i64s], n).unwrap(), expected);

        let with_null: ArrayRef = Arc::new(Int32Array::from(vec![Some(34), None]));
        assert_eq!(bucket_of_rows(&[with_null], n).unwrap(), [3, 0]);
        assert_eq!(
            bucket_of_rows(&[Arc::new(Int32Array::from(vec![34])) as ArrayRef], 1).unwrap(),
            [0]
        );
    }

    #[test]
    fn multi_column_buckets() {
        let ids: ArrayRef = Arc::new(Int32Array::from((0..64).collect::<Vec<_>>()));
        let names: ArrayRef = Arc::new(StringArray::from(
            (0..64).map(|i| Some(format!("n{i}"))).collect::<Vec<_>>(),
        ));
        let n = 1024;
        let multi = bucket_of_rows(&[Arc::clone(&ids), Arc::clone(&names)], n).unwrap();
        assert_eq!(
            multi,
            bucket_of_rows(&[Arc::clone(&ids), Arc::clone(&names)], n).unwrap()
        );
        assert_ne!(multi, bucket_of_rows(&[Arc::clone(&ids)], n).unwrap());
        assert!(multi.iter().all(|b| *b < n));

        // Documented combination, computed by hand for row 0: (0i32, "n0").
        let mut input = 8u32.to_le_bytes().to_vec();
        input.extend_from_slice(&0i64.to_le_bytes());
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(b"n0");
        assert_eq!(multi[0], (murmur3_32(&input) & i32::MAX) as u32 % n);

        // A null is length 0xFFFF_FFFF with no bytes, distinct from an empty string.
        let a: ArrayRef = Arc::new(StringArray::from(vec![None, Some("")]));
        let b: ArrayRef = Arc::new(Int32Array::from(vec![7, 7]));
        let got = bucket_of_rows(&[a, b], u32::MAX).unwrap();
        let mut null_input = u32::MAX.to_le_bytes().to_vec();
        null_input.extend_from_slice(&8u32.to_le_bytes());
        null_input.extend_from_slice(&7i64.to_le_bytes());
        assert_eq!(got[0], (murmur3_32(&null_input) & i32::MAX) as u32);
        assert_ne!(got[0], got[1]);
    }

    #[test]
    fn errors() {
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        for bad in [
            Arc::new(BooleanArray::from(vec![true, false])) as ArrayRef,
            Arc::new(Float64Array::from(vec![1.0, 2.0])),
            Arc::new(UInt64Array::from(vec![1, 2])),
        ] {
            let err = bucket_of_rows(&[Arc::clone(&ints), bad], 4).unwrap_err();
            assert!(matches!(err, BucketError::UnsupportedType(_)), "{err}");
        }
        assert!(matches!(
            bucket_of_rows(&[Arc::clone(&ints)], 0),
            Err(BucketError::ZeroBuckets)
        ));
        assert!(matches!(
            bucket_of_rows(&[], 4),
            Err(BucketError::NoColumns)
        ));
        let short: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        assert!(matches!(
            bucket_of_rows(&[ints, short], 4),
            Err(BucketError::LengthMismatch {
                column: 1,
                expected: 2,
                actual: 1
            })
        ));
    }
}
