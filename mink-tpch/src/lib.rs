//! TPC-H for mink's tests and benchmarks: the eight tables ([`data`]: their columns as
//! SQL, their rows from `tpchgen` at a scale factor) and the 22 queries with the
//! specification's validation parameters ([`query`]; Q15's view is a CTE).

pub mod data;

use arrow::array::RecordBatch;
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};

pub use data::{CUSTOMER, LINEITEM, NATION, ORDERS, PART, PARTSUPP, REGION, SUPPLIER, TpchTable};

/// The 22 queries, Q1 first.
const QUERIES: [&str; 22] = [
    include_str!("../queries/q1.sql"),
    include_str!("../queries/q2.sql"),
    include_str!("../queries/q3.sql"),
    include_str!("../queries/q4.sql"),
    include_str!("../queries/q5.sql"),
    include_str!("../queries/q6.sql"),
    include_str!("../queries/q7.sql"),
    include_str!("../queries/q8.sql"),
    include_str!("../queries/q9.sql"),
    include_str!("../queries/q10.sql"),
    include_str!("../queries/q11.sql"),
    include_str!("../queries/q12.sql"),
    include_str!("../queries/q13.sql"),
    include_str!("../queries/q14.sql"),
    include_str!("../queries/q15.sql"),
    include_str!("../queries/q16.sql"),
    include_str!("../queries/q17.sql"),
    include_str!("../queries/q18.sql"),
    include_str!("../queries/q19.sql"),
    include_str!("../queries/q20.sql"),
    include_str!("../queries/q21.sql"),
    include_str!("../queries/q22.sql"),
];

/// Query `number` (1 to 22).
///
/// # Panics
/// A number outside 1 to 22.
pub fn query(number: usize) -> &'static str {
    QUERIES[number - 1]
}

/// Every row of `batches` as text (decimals and dates render exactly, cells joined by
/// ` | `), sorted: how two runs' answers are compared.
///
/// # Errors
/// A column of a type Arrow cannot display.
pub fn sorted_rows(batches: &[RecordBatch]) -> Result<Vec<String>, ArrowError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|column| ArrayFormatter::try_new(column.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            rows.push(cells.join(" | "));
        }
    }
    rows.sort();
    Ok(rows)
}
