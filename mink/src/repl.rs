//! The interactive shell of `mink sql`: statements end with `;` and may span lines;
//! history is kept in `~/.mink_history`. `\q` (or Ctrl-D) quits, Ctrl-C drops the
//! statement being typed.

use std::path::PathBuf;
use std::time::Instant;

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::commands::sql::{SqlTarget, ends_statement, run_statement, split_statements};
use crate::error::CliError;
use crate::output::Format;

const PROMPT: &str = "mink> ";
const CONTINUATION: &str = "   -> ";

/// Runs the shell until the user quits. Errors of a statement are printed, not returned.
pub(crate) async fn run(target: &SqlTarget, format: Format) -> Result<(), CliError> {
    let mut editor = DefaultEditor::new().map_err(shell_error)?;
    let history = history_path();
    if let Some(path) = &history {
        // No history yet is fine.
        let _ = editor.load_history(path);
    }
    eprintln!("mink sql: statements end with ';', \\q quits");
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION
        };
        let line = tokio::task::block_in_place(|| editor.readline(prompt));
        match line {
            Ok(line) => {
                if buffer.is_empty() && matches!(line.trim(), "\\q" | "quit" | "exit") {
                    break;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !ends_statement(&buffer) {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.trim());
                for statement in split_statements(&std::mem::take(&mut buffer)) {
                    let start = Instant::now();
                    match run_statement(target, &statement, format).await {
                        Ok(rows) => {
                            eprintln!("({rows} rows, {:.3} s)", start.elapsed().as_secs_f64())
                        }
                        Err(error) => eprintln!("error: {error}"),
                    }
                }
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(error) => return Err(shell_error(error)),
        }
    }
    if let Some(path) = &history
        && let Err(error) = editor.save_history(path)
    {
        eprintln!("warning: history not saved to {}: {error}", path.display());
    }
    Ok(())
}

fn history_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".mink_history"))
}

fn shell_error(error: ReadlineError) -> CliError {
    CliError::io("the interactive shell")(std::io::Error::other(error))
}
