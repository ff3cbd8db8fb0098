//! `GetSqlInfo`: what the server tells a client about itself and its SQL dialect.
//!
//! JDBC's `DatabaseMetaData` and BI tools read these on connect: the server's name and
//! version, how identifiers are quoted, the keywords (sqlparser's list, the parser mink
//! uses) and the functions by kind, taken from DataFusion's function registry and the
//! documentation section of each function, so the lists are exactly what a query can
//! call. Every `SqlInfo` the spec defines is answered (the JDBC driver's `DatabaseMetaData`
//! fails on a missing one); a test checks. Each answer is what the service does: where
//! one is a claim about SQL (quoting, `LIKE ... ESCAPE`, subqueries, identifiers), the
//! integration tests (`flight_sql_metadata`) run the SQL it claims works.

use std::collections::{BTreeMap, BTreeSet};

use arrow_flight::error::FlightError;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    SqlInfo, SqlNullOrdering, SqlOuterJoinsSupportLevel, SqlSupportedCaseSensitivity,
    SqlSupportedGroupBy, SqlSupportedResultSetConcurrency, SqlSupportedResultSetType,
    SqlSupportedSubqueries, SqlSupportedTransaction, SqlSupportedUnions,
    SqlTransactionIsolationLevel, SupportedSqlGrammar,
};
use datafusion::execution::SessionState;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use mink_sql::session::limits::MAX_STATEMENT_BYTES;

/// The server's answers (built once, when the server starts), for a server that takes
/// at most `max_connections` connections.
///
/// # Errors
/// A value does not have its spec type (a bug).
pub(crate) fn sql_info(max_connections: usize) -> Result<SqlInfoData, FlightError> {
    let state = SessionContext::new().state();
    let functions = Functions::of(&state);
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "mink");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    info.append(SqlInfo::FlightSqlServerArrowVersion, "58");
    info.append(SqlInfo::FlightSqlServerReadOnly, false);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, false);
    // No Substrait: no versions.
    info.append(SqlInfo::FlightSqlServerSubstraitMinVersion, "");
    info.append(SqlInfo::FlightSqlServerSubstraitMaxVersion, "");
    info.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    // `CancelFlightInfo` and the older `CancelQuery` stop a FlightInfo's result streams.
    info.append(SqlInfo::FlightSqlServerCancel, true);
    info.append(SqlInfo::FlightSqlServerBulkIngestion, true);
    info.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, false);
    // No timeouts: a statement runs until it ends, is cancelled or its client goes.
    info.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    info.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    info.append(SqlInfo::SqlDdlCatalog, false);
    // Databases exist through their tables: no `CREATE SCHEMA`.
    info.append(SqlInfo::SqlDdlSchema, false);
    info.append(SqlInfo::SqlDdlTable, true);
    info.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    // `"Name"` keeps its case and is told from `"name"`: case sensitive, which Flight SQL's
    // enum has no value for; `UNKNOWN` is what its ODBC driver reads as SQL_IC_SENSITIVE
    // (`CASE_INSENSITIVE` would say `"Name"` and `"name"` are the same column).
    info.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityUnknown as i32,
    );
    info.append(SqlInfo::SqlAllTablesAreSelectable, true);
    info.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    let keywords: Vec<String> = ALL_KEYWORDS.iter().map(|k| k.to_string()).collect();
    info.append(SqlInfo::SqlKeywords, keywords);
    info.append(SqlInfo::SqlNumericFunctions, functions.numeric);
    info.append(SqlInfo::SqlStringFunctions, functions.string);
    info.append(SqlInfo::SqlDatetimeFunctions, functions.datetime);
    info.append(SqlInfo::SqlSystemFunctions, functions.system);
    // `LIKE` escapes with a backslash, and `ESCAPE '\'` says so (DataFusion takes no
    // other escape character).
    info.append(SqlInfo::SqlSearchStringEscape, "\\");
    // sqlparser's generic dialect: `@`, `$`, `#` within an unquoted name (`t$lake`).
    info.append(SqlInfo::SqlExtraNameCharacters, "@$#");
    info.append(SqlInfo::SqlSupportsColumnAliasing, true);
    info.append(SqlInfo::SqlNullPlusNullIsNull, true);
    info.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    info.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    info.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    info.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    info.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    info.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    info.append(
        SqlInfo::SqlSupportedGrammar,
        bits(&[
            SupportedSqlGrammar::SqlMinimumGrammar as i32,
            SupportedSqlGrammar::SqlCoreGrammar as i32,
        ]),
    );
    info.append(SqlInfo::SqlAnsi92SupportedLevel, bits(&[ANSI92_ENTRY_SQL]));
    info.append(SqlInfo::SqlSupportsIntegrityEnhancementFacility, false);
    info.append(
        SqlInfo::SqlSupportedGroupBy,
        bits(&[
            SqlSupportedGroupBy::SqlGroupByUnrelated as i32,
            SqlSupportedGroupBy::SqlGroupByBeyondSelect as i32,
        ]),
    );
    info.append(
        SqlInfo::SqlOuterJoinsSupportLevel,
        SqlOuterJoinsSupportLevel::SqlFullOuterJoins as i32,
    );
    info.append(
        SqlInfo::SqlSupportedSubqueries,
        bits(&[
            SqlSupportedSubqueries::SqlSubqueriesInComparisons as i32,
            SqlSupportedSubqueries::SqlSubqueriesInExists as i32,
            SqlSupportedSubqueries::SqlSubqueriesInIns as i32,
            SqlSupportedSubqueries::SqlSubqueriesInQuantifieds as i32,
        ]),
    );
    info.append(
        SqlInfo::SqlSupportedUnions,
        bits(&[
            SqlSupportedUnions::SqlUnion as i32,
            SqlSupportedUnions::SqlUnionAll as i32,
        ]),
    );
    info.append(
        SqlInfo::SqlSupportsConvert,
        BTreeMap::<i32, Vec<i32>>::new(),
    );
    info.append(SqlInfo::SqlSupportedPositionedCommands, 0i32);
    info.append(SqlInfo::SqlSchemasSupportedActions, 0i32);
    info.append(SqlInfo::SqlCatalogsSupportedActions, 0i32);
    // No transactions: every statement commits when it answers.
    info.append(SqlInfo::SqlTransactionsSupported, false);
    info.append(
        SqlInfo::SqlDefaultTransactionIsolation,
        SqlTransactionIsolationLevel::SqlTransactionNone as i32,
    );
    info.append(SqlInfo::SqlSupportedTransactionsIsolationLevels, 0i32);
    info.append(SqlInfo::SqlDataDefinitionCausesTransactionCommit, false);
    info.append(SqlInfo::SqlDataDefinitionsInTransactionsIgnored, false);
    info.append(
        SqlInfo::SqlSupportedResultSetTypes,
        bits(&[SqlSupportedResultSetType::SqlResultSetTypeForwardOnly as i32]),
    );
    let read_only =
        bits(&[SqlSupportedResultSetConcurrency::SqlResultSetConcurrencyReadOnly as i32]);
    for concurrencies in [
        SqlInfo::SqlSupportedConcurrenciesForResultSetUnspecified,
        SqlInfo::SqlSupportedConcurrenciesForResultSetForwardOnly,
        SqlInfo::SqlSupportedConcurrenciesForResultSetScrollSensitive,
        SqlInfo::SqlSupportedConcurrenciesForResultSetScrollInsensitive,
    ] {
        info.append(concurrencies, read_only);
    }
    info.append(SqlInfo::SqlBatchUpdatesSupported, true);
    info.append(SqlInfo::SqlSavepointsSupported, false);
    info.append(SqlInfo::SqlNamedParametersSupported, false);
    info.append(SqlInfo::SqlLocatorsUpdateCopy, false);
    info.append(SqlInfo::SqlStoredFunctionsUsingCallSyntaxSupported, false);
    info.append(SqlInfo::SqlMaxRowSizeIncludesBlobs, true);
    // Limits: 0 means none (or unknown).
    let max_connections = i64::try_from(max_connections).unwrap_or(i64::MAX);
    info.append(SqlInfo::SqlMaxConnections, max_connections);
    let max_statement = i64::try_from(MAX_STATEMENT_BYTES).unwrap_or(i64::MAX);
    info.append(SqlInfo::SqlMaxStatementLength, max_statement);
    for limit in [
        SqlInfo::SqlMaxBinaryLiteralLength,
        SqlInfo::SqlMaxCharLiteralLength,
        SqlInfo::SqlMaxColumnNameLength,
        SqlInfo::SqlMaxColumnsInGroupBy,
        SqlInfo::SqlMaxColumnsInIndex,
        SqlInfo::SqlMaxColumnsInOrderBy,
        SqlInfo::SqlMaxColumnsInSelect,
        SqlInfo::SqlMaxColumnsInTable,
        SqlInfo::SqlMaxCursorNameLength,
        SqlInfo::SqlMaxIndexLength,
        SqlInfo::SqlDbSchemaNameLength,
        SqlInfo::SqlMaxProcedureNameLength,
        SqlInfo::SqlMaxCatalogNameLength,
        SqlInfo::SqlMaxRowSize,
        SqlInfo::SqlMaxStatements,
        SqlInfo::SqlMaxTableNameLength,
        SqlInfo::SqlMaxTablesInSelect,
        SqlInfo::SqlMaxUsernameLength,
    ] {
        info.append(limit, 0i64);
    }
    info.append(SqlInfo::SqlSchemaTerm, "database");
    info.append(SqlInfo::SqlProcedureTerm, "procedure");
    info.append(SqlInfo::SqlCatalogTerm, "catalog");
    info.append(SqlInfo::SqlCatalogAtStart, true);
    info.append(SqlInfo::SqlSelectForUpdateSupported, false);
    // `CALL system.tier('t')` runs mink's procedures, but JDBC's `{call ...}` escape and
    // procedure metadata are not served.
    info.append(SqlInfo::SqlStoredProceduresSupported, false);
    info.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    info.build()
}

/// `SupportedAnsi92SqlGrammarLevel::ANSI92_ENTRY_SQL` (arrow-flight does not export the
/// enum).
const ANSI92_ENTRY_SQL: i32 = 0;

/// The bitmask of some enum values: bit `v` set for each value `v`.
fn bits(values: &[i32]) -> i32 {
    values.iter().fold(0, |mask, value| mask | (1 << value))
}

/// DataFusion's functions by the kind JDBC distinguishes, sorted.
#[derive(Debug, Default)]
struct Functions {
    numeric: Vec<String>,
    string: Vec<String>,
    datetime: Vec<String>,
    system: Vec<String>,
}

impl Functions {
    fn of(state: &SessionState) -> Self {
        let mut kinds: [BTreeSet<String>; 4] = Default::default();
        for (name, function) in state.scalar_functions() {
            let section = function.documentation().map(|d| d.doc_section.label);
            let kind = match section {
                Some("Math Functions") => 0,
                Some(
                    "String Functions" | "Binary String Functions" | "Regular Expression Functions",
                ) => 1,
                Some("Time and Date Functions") => 2,
                _ => 3,
            };
            kinds[kind].insert(name.clone());
        }
        kinds[3].extend(state.aggregate_functions().keys().cloned());
        kinds[3].extend(state.window_functions().keys().cloned());
        let [numeric, string, datetime, system] = kinds.map(|names| names.into_iter().collect());
        Self {
            numeric,
            string,
            datetime,
            system,
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;

    use super::*;

    #[test]
    fn functions_are_sorted_by_kind() {
        let functions = Functions::of(&SessionContext::new().state());
        assert!(functions.numeric.contains(&"abs".to_string()));
        assert!(functions.string.contains(&"upper".to_string()));
        assert!(functions.datetime.contains(&"date_trunc".to_string()));
        assert!(functions.system.contains(&"count".to_string()));
    }

    #[test]
    fn bitmasks_set_one_bit_per_value() {
        assert_eq!(bits(&[0, 1]), 3);
        assert_eq!(bits(&[1]), 2);
        assert_eq!(bits(&[]), 0);
    }

    #[test]
    fn every_sql_info_is_answered() {
        let info = sql_info(64).unwrap();
        let missing: Vec<SqlInfo> = (0..=1000)
            .filter_map(|id| SqlInfo::try_from(id).ok())
            .filter(|name| info.record_batch([*name as u32]).unwrap().num_rows() == 0)
            .collect();
        assert!(missing.is_empty(), "{missing:?}");
    }

    #[test]
    fn cancellation_and_the_connection_bound_are_what_the_server_serves() {
        let info = sql_info(64).unwrap();
        let value = |name: SqlInfo| {
            let batch = info.record_batch([name as u32]).unwrap();
            batch.column(1).as_union().value(0)
        };
        assert!(value(SqlInfo::FlightSqlServerCancel).as_boolean().value(0));
        let connections = value(SqlInfo::SqlMaxConnections);
        assert_eq!(connections.as_primitive::<Int64Type>().value(0), 64);
    }

    #[test]
    fn the_server_names_itself() {
        let batch = sql_info(64)
            .unwrap()
            .record_batch([SqlInfo::FlightSqlServerName as u32])
            .unwrap();
        assert_eq!(batch.num_rows(), 1);
        let value = batch.column(1).as_union().value(0);
        assert_eq!(value.as_string::<i32>().value(0), "mink");
    }
}
