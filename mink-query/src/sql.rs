//! `mink sql`: SQL over mink tables, against a running node or an embedded one.
//!
//! ```text
//! mink sql [--connect HOST:PORT | --data-dir DIR] [-e SQL]... [-f FILE] [--format table|csv|json]
//! ```
//!
//! Each `-e` statement (then the statements of `-f`, separated by `;`) runs in order in
//! one session whose default catalog is `mink` and default schema `default`: tables are
//! `t`, `db.t` or `mink.db.t`. Every table is read by union splits (see `mink-provider`),
//! so a query sees each bucket as it is when the query is planned.
//!
//! Statements are run by [`MinkSession`]: queries and DML by DataFusion, DDL and `CALL`
//! by mink.

use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use mink_lake::storage::LakeStorage;
use mink_query::session::MinkSession;
use object_store::local::LocalFileSystem;

use crate::embedded::NodeArgs;
use crate::error::CliError;
use crate::output::{BatchPrinter, Format};

/// Arguments of `mink sql`.
#[derive(Debug, clap::Args)]
pub(crate) struct SqlArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// A statement to run (repeatable; they run in order).
    #[arg(short = 'e', long = "execute")]
    statements: Vec<String>,
    /// A file of statements separated by `;`, run after the `-e` ones.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// How results are printed.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub(crate) async fn run(args: SqlArgs) -> Result<(), CliError> {
    let mut statements = args.statements.clone();
    if let Some(file) = &args.file {
        let text = std::fs::read_to_string(file)
            .map_err(CliError::io(format!("reading {}", file.display())))?;
        statements.extend(split_statements(&text));
    }
    if statements.is_empty() {
        return Err(CliError::Usage(
            "nothing to run: give statements with -e or -f".into(),
        ));
    }
    let connection = args.node.connect().await?;
    let result = async {
        let session = session(&connection.client).await?;
        for statement in &statements {
            run_statement(&session, statement, args.format).await?;
        }
        Ok(())
    }
    .await;
    connection.close().await?;
    result
}

/// A session over the node's tables.
async fn session(client: &mink_client::MinkClient) -> Result<MinkSession, CliError> {
    // Lake locations are absolute paths of the node's file system (embedded lake) or URLs.
    let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
    Ok(MinkSession::connect(client.clone(), storage).await?)
}

/// Runs one statement, printing its rows.
async fn run_statement(
    session: &MinkSession,
    statement: &str,
    format: Format,
) -> Result<(), CliError> {
    let frame = session.sql(statement).await?;
    let mut batches = frame.execute_stream().await?;
    let mut printer = BatchPrinter::new(format);
    while let Some(batch) = batches.try_next().await? {
        printer.print(&batch)?;
    }
    Ok(())
}

/// The non-empty statements of a script separated by `;` (a `;` inside quotes does not
/// separate).
fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                statements.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    statements.push(current);
    statements
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_split_on_semicolons_outside_quotes() {
        assert_eq!(
            split_statements("SELECT 1; SELECT ';' ;\n\n SELECT \"a;b\" FROM t;"),
            vec!["SELECT 1", "SELECT ';'", "SELECT \"a;b\" FROM t"]
        );
        assert!(split_statements(" ; ;").is_empty());
    }
}
