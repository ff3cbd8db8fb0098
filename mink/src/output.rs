//! Printing batches on stdout as an aligned table, CSV or JSON lines.

use std::io::Write;

use arrow::array::RecordBatch;

use crate::error::CliError;

/// How rows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// An aligned text table.
    Table,
    /// CSV: a header line, then one line per row.
    Csv,
    /// One JSON object per row.
    Json,
}

/// Prints batches one after another; a CSV header is printed once.
#[derive(Debug)]
pub(crate) struct BatchPrinter {
    format: Format,
    wrote_header: bool,
}

impl BatchPrinter {
    pub(crate) fn new(format: Format) -> Self {
        Self {
            format,
            wrote_header: false,
        }
    }

    /// Prints the rows of `batch` to stdout.
    pub(crate) fn print(&mut self, batch: &RecordBatch) -> Result<(), CliError> {
        let mut stdout = std::io::stdout().lock();
        match self.format {
            Format::Table => {
                if batch.num_rows() > 0 {
                    let table =
                        arrow::util::pretty::pretty_format_batches(std::slice::from_ref(batch))?;
                    writeln!(stdout, "{table}").map_err(CliError::io("writing to stdout"))?;
                }
            }
            Format::Csv => {
                let mut writer = arrow::csv::WriterBuilder::new()
                    .with_header(!self.wrote_header)
                    .build(&mut stdout);
                writer.write(batch)?;
                self.wrote_header = true;
            }
            Format::Json => {
                let mut writer = arrow::json::LineDelimitedWriter::new(&mut stdout);
                writer.write(batch)?;
                writer.finish()?;
            }
        }
        stdout.flush().map_err(CliError::io("writing to stdout"))
    }
}
