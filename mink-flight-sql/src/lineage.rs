//! Which table column each column of a statement's result reads, found on its logical
//! plan, so that the result's column metadata can name the column's catalog, database
//! and table (JDBC's `getCatalogName`, `getSchemaName`, `getTableName`) and say whether
//! it is read-only ([`columns`](super::columns)).
//!
//! A result column *reads* a table column when its values are that column's values,
//! possibly fewer or repeated: a column named in the select list (aliased or not), kept
//! through filters, sorts, limits, joins, `DISTINCT`, subqueries and CTEs, or a grouping
//! column of an aggregate. Anything computed from it (a cast, a function, an aggregate,
//! a `UNION` of several tables) reads no column. The walk goes down the plan from the
//! result:
//!
//! ```text
//! Projection: e.id, upper(e.kind)              id ─► e.id          upper(..) ─► none
//!   SubqueryAlias: e                           e.id ─► (position)  demo.events.id
//!     Filter: demo.events.value > 1            passes its input's columns through
//!       TableScan: demo.events                 demo.events.id  ─► table demo.events, column id
//! ```
//!
//! The plan walked is the one planned from the SQL, before the optimizer rewrites it.
//! [`result_origins`] then resolves each table as the session does and keeps only the
//! tables its catalog holds (a `VALUES` list, a `CALL`'s answer, a table function read
//! no table).

use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Distinct, Expr, LogicalPlan};

use crate::columns::ColumnOrigin;

/// A table, as the plan names it, and one of its columns.
pub(crate) type Source = (TableReference, String);

/// The origin of each column of `plan`'s result, in order: the table column it reads,
/// when the session's catalog holds that table (see the module docs).
pub(crate) fn result_origins(
    state: &SessionState,
    plan: &LogicalPlan,
) -> Vec<Option<ColumnOrigin>> {
    let catalog = &state.config_options().catalog;
    sources(plan)
        .into_iter()
        .map(|source| {
            let (reference, _column) = source?;
            let resolved = reference
                .clone()
                .resolve(&catalog.default_catalog, &catalog.default_schema);
            let schema = state.schema_for_ref(reference).ok()?;
            schema
                .table_exist(&resolved.table)
                .then(|| ColumnOrigin::new(&resolved.catalog, &resolved.schema, &resolved.table))
        })
        .collect()
}

/// The table column each column of `plan` reads, if any (see the module docs).
pub(crate) fn sources(plan: &LogicalPlan) -> Vec<Option<Source>> {
    match plan {
        LogicalPlan::TableScan(scan) => scan
            .projected_schema
            .fields()
            .iter()
            .map(|field| Some((scan.table_name.clone(), field.name().clone())))
            .collect(),
        LogicalPlan::Projection(projection) => selected(
            &projection.expr,
            &projection.input,
            plan.schema().fields().len(),
        ),
        LogicalPlan::Distinct(Distinct::On(distinct)) => selected(
            &distinct.select_expr,
            &distinct.input,
            plan.schema().fields().len(),
        ),
        LogicalPlan::Aggregate(aggregate) => {
            let outputs: Vec<Expr> = aggregate
                .group_expr
                .iter()
                .chain(&aggregate.aggr_expr)
                .cloned()
                .collect();
            let grouping_sets = aggregate
                .group_expr
                .iter()
                .any(|e| matches!(e, Expr::GroupingSet(_)));
            match grouping_sets {
                // Grouping sets null the columns a set leaves out, and add a column.
                true => vec![None; plan.schema().fields().len()],
                false => selected(&outputs, &aggregate.input, plan.schema().fields().len()),
            }
        }
        // Renames the qualifier of every column, in place.
        LogicalPlan::SubqueryAlias(alias) => sources(&alias.input),
        // Each column reads one column of every input, not one table's.
        LogicalPlan::Union(_) | LogicalPlan::RecursiveQuery(_) => {
            vec![None; plan.schema().fields().len()]
        }
        // Filters, sorts, limits, joins, windows, ...: a column of an input is passed
        // through under the same name and type.
        _ => passed_through(plan),
    }
}

/// The sources of `exprs` computed over `input`; the result has `len` columns.
fn selected(exprs: &[Expr], input: &LogicalPlan, len: usize) -> Vec<Option<Source>> {
    let input_sources = sources(input);
    let mut found: Vec<Option<Source>> = exprs
        .iter()
        .map(|expr| {
            let column = named_column(expr)?;
            let index = input.schema().maybe_index_of_column(column)?;
            input_sources.get(index).cloned().flatten()
        })
        .collect();
    found.resize(len, None);
    found
}

/// The column an expression is, under an alias or not.
fn named_column(expr: &Expr) -> Option<&Column> {
    match expr {
        Expr::Column(column) => Some(column),
        Expr::Alias(alias) => named_column(&alias.expr),
        _ => None,
    }
}

/// For a plan that passes its inputs' columns through: each of its columns found, by
/// qualified name and with the same type, in one of its inputs reads what that input's
/// column reads.
fn passed_through(plan: &LogicalPlan) -> Vec<Option<Source>> {
    let inputs: Vec<(&DFSchema, Vec<Option<Source>>)> = plan
        .inputs()
        .into_iter()
        .map(|input| (input.schema().as_ref(), sources(input)))
        .collect();
    plan.schema()
        .iter()
        .map(|(qualifier, field)| {
            let column = Column::new(qualifier.cloned(), field.name());
            inputs.iter().find_map(|(schema, sources)| {
                let index = schema.maybe_index_of_column(&column)?;
                let same_type = schema.field(index).data_type() == field.data_type();
                same_type
                    .then(|| sources.get(index).cloned().flatten())
                    .flatten()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    /// A session whose default database holds `events (id, kind, value)` and `users
    /// (id, name)`.
    async fn planned(sql: &str) -> (SessionState, LogicalPlan) {
        let config = SessionConfig::new().with_information_schema(true);
        let context = SessionContext::new_with_config(config);
        let events = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("kind", DataType::Utf8, true),
            Field::new("value", DataType::Float64, true),
        ];
        let users = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ];
        for (name, fields) in [("events", events), ("users", users)] {
            let schema = Arc::new(Schema::new(fields));
            let table = MemTable::try_new(schema, vec![vec![]]).unwrap();
            context.register_table(name, Arc::new(table)).unwrap();
        }
        let frame = context.sql(sql).await.unwrap();
        frame.into_parts()
    }

    /// `table.column` (the table's last name part) for each result column, `-` for none.
    async fn read(sql: &str) -> Vec<String> {
        let (_, plan) = planned(sql).await;
        sources(&plan)
            .into_iter()
            .map(|source| match source {
                Some((table, column)) => format!("{}.{column}", table.table()),
                None => "-".to_string(),
            })
            .collect()
    }

    #[tokio::test]
    async fn selected_columns_read_their_table_and_computed_ones_nothing() {
        assert_eq!(
            read("SELECT * FROM events").await,
            ["events.id", "events.kind", "events.value"]
        );
        assert_eq!(
            read("SELECT kind AS k, upper(kind), id + 1, CAST(id AS INT) FROM events").await,
            ["events.kind", "-", "-", "-"]
        );
        assert_eq!(read("SELECT 1, 'x'").await, ["-", "-"]);
    }

    #[tokio::test]
    async fn columns_pass_through_filters_sorts_limits_aliases_and_ctes() {
        assert_eq!(
            read("SELECT e.kind FROM events e WHERE e.value > 1 ORDER BY e.id LIMIT 3").await,
            ["events.kind"]
        );
        assert_eq!(
            read("WITH recent AS (SELECT id, kind FROM events) SELECT kind, id FROM recent").await,
            ["events.kind", "events.id"]
        );
        assert_eq!(
            read("SELECT DISTINCT kind FROM (SELECT kind FROM events) AS sub").await,
            ["events.kind"]
        );
    }

    #[tokio::test]
    async fn joins_keep_each_side_and_aggregates_their_grouping_columns() {
        assert_eq!(
            read("SELECT u.name, e.kind, e.id FROM events e JOIN users u ON e.id = u.id").await,
            ["users.name", "events.kind", "events.id"]
        );
        assert_eq!(
            read("SELECT kind, count(*), max(value) FROM events GROUP BY kind").await,
            ["events.kind", "-", "-"]
        );
        assert_eq!(
            read("SELECT kind, count(*) FROM events GROUP BY ROLLUP (kind)").await,
            ["-", "-"]
        );
        assert_eq!(
            read("SELECT id, row_number() OVER (ORDER BY id) FROM events").await,
            ["events.id", "-"]
        );
    }

    #[tokio::test]
    async fn a_union_reads_no_single_table() {
        assert_eq!(
            read("SELECT id FROM events UNION ALL SELECT id FROM users").await,
            ["-"]
        );
    }

    #[tokio::test]
    async fn origins_are_resolved_in_the_session_and_kept_only_for_its_tables() {
        let (state, plan) =
            planned("SELECT e.kind, t.table_name, 2 FROM events e, information_schema.tables t")
                .await;
        let origins = result_origins(&state, &plan);
        let events = origins[0].as_ref().expect("events");
        assert_eq!(
            (
                events.catalog.as_str(),
                events.database.as_str(),
                events.table.as_str()
            ),
            ("datafusion", "public", "events")
        );
        let tables = origins[1].as_ref().expect("information_schema.tables");
        assert_eq!(tables.database, "information_schema");
        assert!(!tables.writable);
        assert_eq!(origins[2], None);
    }
}
