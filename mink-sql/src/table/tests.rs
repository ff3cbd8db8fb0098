//! [`point_keys`]: which statements a primary-key table answers by looking keys up,
//! from the filters DataFusion pushes into the scan.

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{col, lit};
use mink_core::options::TableOptions;
use mink_core::table::TablePath;

use super::*;

/// `db.t (region TEXT, id BIGINT, n INT, at TIMESTAMP, v DOUBLE)` keyed by `key`.
fn keyed_by(key: &[&str]) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("region", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
        Field::new("n", DataType::Int32, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("v", DataType::Float64, true),
    ]);
    TableDescriptor::new(
        TablePath::new("db", "t"),
        schema,
        key.iter().map(|c| c.to_string()).collect(),
        vec![],
        TableOptions::default(),
    )
    .unwrap()
}

/// The keys a scan with `filters` looks up, split from them as the scan does: each
/// exact filter as a column filter, each key `IN` list (or `OR` of equalities) apart.
fn keys(table: &TableDescriptor, filters: &[Expr]) -> Option<RecordBatch> {
    let schema = table.schema();
    let column_filters: Vec<_> = filters
        .iter()
        .filter_map(|expr| to_column_filter(expr, schema))
        .collect();
    let key_lists: Vec<_> = filters
        .iter()
        .filter_map(|expr| in_list_values(expr, schema))
        .filter(|(column, _)| table.primary_key.contains(column))
        .collect();
    point_keys(table, &column_filters, &key_lists).unwrap()
}

/// The ids of a batch of `id` keys.
fn ids(keys: &RecordBatch) -> Vec<i64> {
    let column = keys.column_by_name("id").unwrap();
    column.as_primitive::<Int64Type>().values().to_vec()
}

/// The `(region, id)` keys of a batch.
fn region_ids(keys: &RecordBatch) -> Vec<(String, i64)> {
    let regions = keys.column_by_name("region").unwrap().as_string::<i32>();
    let ids = keys
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>();
    (0..keys.num_rows())
        .map(|row| (regions.value(row).to_string(), ids.value(row)))
        .collect()
}

#[test]
fn an_equality_on_the_key_is_one_key_of_the_key_columns_only() {
    let table = keyed_by(&["id"]);
    let keys = keys(&table, &[col("id").eq(lit(5i64))]).unwrap();
    assert_eq!(ids(&keys), [5]);
    // The key columns, as the table has them (NOT NULL, being the key).
    assert_eq!(keys.schema().fields().len(), 1);
    assert_eq!(keys.schema().field(0), table.schema().field(1));
    assert!(!keys.schema().field(0).is_nullable());
}

#[test]
fn a_literal_on_the_left_is_the_same_key() {
    let table = keyed_by(&["id"]);
    let keys = keys(&table, &[lit(5i64).eq(col("id"))]).unwrap();
    assert_eq!(ids(&keys), [5]);
}

#[test]
fn an_in_list_is_its_keys_each_once_in_the_order_of_their_text() {
    let table = keyed_by(&["id"]);
    let listed = col("id").in_list(vec![lit(3i64), lit(10i64), lit(2i64), lit(3i64)], false);
    let keys = keys(&table, &[listed]).unwrap();
    // Sorted as text, which only decides the order the lookups are sent in.
    assert_eq!(ids(&keys), [10, 2, 3]);
}

#[test]
fn an_or_of_equalities_is_a_list_of_keys() {
    let table = keyed_by(&["id"]);
    let either = col("id").eq(lit(1i64)).or(col("id").eq(lit(4i64)));
    assert_eq!(ids(&keys(&table, &[either]).unwrap()), [1, 4]);
    let across_columns = col("id").eq(lit(1i64)).or(col("v").eq(lit(4.0)));
    assert!(keys(&table, &[across_columns]).is_none());
}

#[test]
fn a_composite_key_is_every_combination_of_its_columns_values() {
    let table = keyed_by(&["region", "id"]);
    let keys = keys(
        &table,
        &[
            col("region").in_list(vec![lit("us"), lit("eu")], false),
            col("id").in_list(vec![lit(2i64), lit(1i64)], false),
        ],
    )
    .unwrap();
    let names: Vec<_> = keys
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["region", "id"], "in the key's order");
    let expected = [("eu", 1), ("eu", 2), ("us", 1), ("us", 2)];
    assert_eq!(
        region_ids(&keys),
        expected.map(|(region, id)| (region.to_string(), id))
    );
}

#[test]
fn a_composite_key_mixes_equalities_and_lists() {
    let table = keyed_by(&["region", "id"]);
    let keys = keys(
        &table,
        &[
            col("id").eq(lit(7i64)),
            col("region").eq(lit("eu")).or(col("region").eq(lit("us"))),
        ],
    )
    .unwrap();
    assert_eq!(
        region_ids(&keys),
        [("eu".to_string(), 7), ("us".to_string(), 7)]
    );
}

#[test]
fn a_partial_key_is_no_point_read() {
    let table = keyed_by(&["region", "id"]);
    assert!(keys(&table, &[col("region").eq(lit("eu"))]).is_none());
    assert!(keys(&table, &[col("id").in_list(vec![lit(1i64)], false)]).is_none());
    assert!(keys(&table, &[]).is_none());
}

#[test]
fn comparisons_other_than_equality_are_no_point_read() {
    let table = keyed_by(&["id"]);
    for filter in [
        col("id").gt(lit(5i64)),
        col("id").lt_eq(lit(5i64)),
        col("id").not_eq(lit(5i64)),
        col("id").in_list(vec![lit(1i64), lit(2i64)], true),
        col("id").is_not_null(),
    ] {
        assert!(
            keys(&table, std::slice::from_ref(&filter)).is_none(),
            "{filter}"
        );
    }
}

#[test]
fn filters_on_other_columns_neither_make_nor_stop_a_point_read() {
    let table = keyed_by(&["id"]);
    assert!(keys(&table, &[col("v").eq(lit(1.0))]).is_none());
    let both = [col("id").eq(lit(3i64)), col("v").gt(lit(1.0))];
    assert_eq!(ids(&keys(&table, &both).unwrap()), [3]);
}

#[test]
fn literals_of_other_types_are_keys_only_when_they_are_the_same_value() {
    let table = keyed_by(&["id"]);
    assert_eq!(ids(&keys(&table, &[col("id").eq(lit(5i32))]).unwrap()), [5]);
    assert_eq!(ids(&keys(&table, &[col("id").eq(lit(5.0))]).unwrap()), [5]);
    assert_eq!(ids(&keys(&table, &[col("id").eq(lit("5"))]).unwrap()), [5]);
    // 5.5 is no BIGINT: a point read of 5 would be wrong.
    assert!(keys(&table, &[col("id").eq(lit(5.5))]).is_none());
    assert!(
        keys(
            &table,
            &[col("id").in_list(vec![lit(1i64), lit(1.5)], false)]
        )
        .is_none()
    );
    // Past i32: the key column's own type decides.
    let by_n = keyed_by(&["n"]);
    assert!(keys(&by_n, &[col("n").eq(lit(i64::from(i32::MAX) + 1))]).is_none());
    let largest = keys(&by_n, &[col("n").eq(lit(i64::from(i32::MAX)))]).unwrap();
    assert_eq!(
        largest.column(0).as_primitive::<Int32Type>().values(),
        &[i32::MAX]
    );
    // An expression is left to DataFusion, which simplifies a constant one before the
    // scan sees it.
    let cast = Expr::Cast(datafusion::logical_expr::Cast::new(
        Box::new(lit("5")),
        DataType::Int64,
    ));
    assert!(keys(&table, &[col("id").eq(cast)]).is_none());
}

#[test]
fn a_timestamp_key_survives_its_trip_through_text() {
    let table = keyed_by(&["at"]);
    let micros = 1_700_000_000_123_456;
    let at = ScalarValue::TimestampMicrosecond(Some(micros), Some("UTC".into()));
    let keys = keys(&table, &[col("at").eq(lit(at))]).unwrap();
    let column = keys.column(0).as_primitive::<TimestampMicrosecondType>();
    assert_eq!(column.values(), &[micros]);
    assert_eq!(
        keys.schema().field(0).data_type(),
        table.schema().field(3).data_type()
    );
}

#[test]
fn null_is_no_key() {
    let table = keyed_by(&["id"]);
    for filter in [
        col("id").eq(lit(ScalarValue::Int64(None))),
        col("id").is_null(),
        col("id").in_list(vec![lit(1i64), lit(ScalarValue::Int64(None))], false),
    ] {
        assert!(
            keys(&table, std::slice::from_ref(&filter)).is_none(),
            "{filter}"
        );
    }
}

#[test]
fn contradictory_filters_look_up_one_side_and_the_scan_filters_the_rest() {
    let table = keyed_by(&["id"]);
    // `id = 1 AND id = 2` matches nothing: the lookup reads key 1, which the scan's
    // exact filter `id = 2` then drops.
    let both = [col("id").eq(lit(1i64)), col("id").eq(lit(2i64))];
    assert_eq!(ids(&keys(&table, &both).unwrap()), [1]);
    // An equality wins over a list; the list is applied again by DataFusion.
    let equal_and_listed = [
        col("id").in_list(vec![lit(2i64), lit(3i64)], false),
        col("id").eq(lit(1i64)),
    ];
    assert_eq!(ids(&keys(&table, &equal_and_listed).unwrap()), [1]);
}

#[test]
fn at_most_max_lookup_keys_are_looked_up() {
    let table = keyed_by(&["id"]);
    let list = |n: i64| col("id").in_list((0..n).map(lit).collect(), false);
    let limit = MAX_LOOKUP_KEYS as i64;
    assert_eq!(
        keys(&table, &[list(limit)]).unwrap().num_rows(),
        MAX_LOOKUP_KEYS
    );
    assert!(keys(&table, &[list(limit + 1)]).is_none());

    // The bound is on the combinations of a composite key's values.
    let composite = keyed_by(&["region", "id"]);
    let regions = |n: usize| {
        let values = (0..n).map(|i| lit(format!("r{i}"))).collect();
        col("region").in_list(values, false)
    };
    let ids_32 = col("id").in_list((0..32).map(lit).collect(), false);
    let fits = keys(&composite, &[regions(32), ids_32.clone()]).unwrap();
    assert_eq!(fits.num_rows(), 32 * 32);
    assert!(keys(&composite, &[regions(33), ids_32]).is_none());
}

#[test]
fn the_bound_counts_values_before_repeated_ones_are_merged() {
    let table = keyed_by(&["id"]);
    let repeated = col("id").in_list(vec![lit(1i64); MAX_LOOKUP_KEYS + 1], false);
    assert!(keys(&table, &[repeated]).is_none());
    let once = col("id").in_list(vec![lit(1i64); MAX_LOOKUP_KEYS], false);
    assert_eq!(ids(&keys(&table, &[once]).unwrap()), [1]);
}
