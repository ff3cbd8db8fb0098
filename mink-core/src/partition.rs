//! Partition names.
//!
//! A partitioned table keeps one set of buckets per distinct combination of its
//! partition-key values. The partition is named `col=value[/col=value...]`, Hive style,
//! with `/`, `=` and `%` in values percent-escaped so a name always splits back into its
//! values. A null value is written `__null__`.

use arrow::array::ArrayRef;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::Result;

const NULL_VALUE: &str = "__null__";

/// The partition name of every row, given the partition-key columns and their names.
pub fn partition_names(names: &[String], columns: &[ArrayRef]) -> Result<Vec<String>> {
    let rows = columns.first().map_or(0, |c| c.len());
    let options = FormatOptions::default();
    let formatters = columns
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let mut result = Vec::with_capacity(rows);
    let mut value = String::new();
    for row in 0..rows {
        let mut name = String::new();
        for (i, (column, formatter)) in names.iter().zip(&formatters).enumerate() {
            if i > 0 {
                name.push('/');
            }
            name.push_str(column);
            name.push('=');
            if columns[i].is_null(row) {
                name.push_str(NULL_VALUE);
            } else {
                value.clear();
                use std::fmt::Write;
                write!(value, "{}", formatter.value(row)).expect("writing to a String");
                escape_into(&value, &mut name);
            }
        }
        result.push(name);
    }
    Ok(result)
}

fn escape_into(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '/' => out.push_str("%2F"),
            '=' => out.push_str("%3D"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};

    use super::*;

    #[test]
    fn names_per_row() {
        let dt: ArrayRef = Arc::new(StringArray::from(vec![
            Some("2024-01-01"),
            Some("a/b=c%"),
            None,
        ]));
        let n: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let names = partition_names(&["dt".into(), "n".into()], &[dt, n]).unwrap();
        assert_eq!(
            names,
            vec![
                "dt=2024-01-01/n=1",
                "dt=a%2Fb%3Dc%25/n=2",
                "dt=__null__/n=3"
            ]
        );
    }
}
