//! Point and prefix reads of a KV tablet.

use arrow::array::RecordBatch;
use arrow::row::Rows;
use mink_core::key::{KeyCodec, PrefixCodec, RowCodec};
use mink_core::table::TableDescriptor;

use super::KvTablet;
use crate::error::Result;

/// Rows found for a lookup, and for each the index of the key (or prefix) it answers.
#[derive(Debug)]
pub struct Found {
    /// The rows, in the table's current schema.
    pub rows: RecordBatch,
    /// `key_indices[i]` is the request key row `i` answers.
    pub key_indices: Vec<u32>,
}

/// The stored row of each key of `keys` (a batch holding the primary-key columns).
pub fn lookup(table: &TableDescriptor, kv: &KvTablet, keys: &RecordBatch) -> Result<Found> {
    let encoded = encode_keys(table, keys, false)?;
    let keys: Vec<&[u8]> = encoded.iter().map(|key| key.data()).collect();
    let mut values = Vec::new();
    let mut key_indices = Vec::new();
    for (index, value) in kv.get_many(&keys)?.into_iter().enumerate() {
        if let Some(value) = value {
            values.push(value);
            key_indices.push(index as u32);
        }
    }
    let rows = RowCodec::new(table)?.decode(&values)?;
    Ok(Found { rows, key_indices })
}

/// One range scan per prefix of `prefixes` (a batch whose columns are the first key
/// columns, by name, in key order).
pub fn prefix_lookup(
    table: &TableDescriptor,
    kv: &KvTablet,
    prefixes: &RecordBatch,
) -> Result<Found> {
    let encoded = encode_keys(table, prefixes, true)?;
    let mut values = Vec::new();
    let mut key_indices = Vec::new();
    for (index, prefix) in encoded.iter().enumerate() {
        for value in kv.prefix(prefix.as_ref())? {
            values.push(value);
            key_indices.push(index as u32);
        }
    }
    let rows = RowCodec::new(table)?.decode(&values)?;
    Ok(Found { rows, key_indices })
}

/// Encodes the keys of a lookup, or the prefixes of a prefix lookup (whose columns, by
/// name, must be the first key columns).
///
/// # Errors
/// A missing or null key column, or prefix columns that are not a key prefix.
pub fn encode_keys(table: &TableDescriptor, keys: &RecordBatch, prefix: bool) -> Result<Rows> {
    if !prefix {
        return Ok(KeyCodec::new(table)?.encode(keys)?);
    }
    let names: Vec<String> = keys
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    Ok(PrefixCodec::new(table, &names)?.encode(keys)?)
}
