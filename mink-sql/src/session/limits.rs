//! The bounds on one SQL statement, so that no statement a client sends can stop the
//! process that plans and runs it (a server's Flight SQL port, `mink worker`).
//!
//! Two kinds of statements would otherwise kill the process, both a few bytes long:
//!
//! - **Deep expressions.** DataFusion's planner and optimizer walk an expression tree
//!   recursively, and a chain of operators (`1+1+...+1`, `c = 0 OR c = 1 OR ...`) is a tree
//!   as deep as it is long: ten thousand terms overflowed an 8 MiB stack, which aborts the
//!   process. A statement is measured on its tokens before anything parses it
//!   ([`super::depth`]), and refused when its text is longer than [`MAX_STATEMENT_BYTES`]
//!   or its expressions are deeper than [`MAX_EXPRESSION_DEPTH`]. The threads that plan and
//!   run statements have stacks of [`STATEMENT_STACK_BYTES`]: the bound sits well below
//!   the depth measured to overflow them (see the constants).
//! - **Results sized by an argument.** `repeat('x', 1099511627776)`, `array_repeat(1,
//!   100000000000)`, `range(100000000000)` ask DataFusion for one allocation of the size
//!   an argument names; the allocation fails and the process aborts, even under
//!   `EXPLAIN`, since the optimizer folds constant calls; `regexp_replace(repeat('x',
//!   10000000), '', repeat('y', 10000000), 'g')` asks for 5 GB, ten million bytes for
//!   each empty match, and `regexp_match` copies its text once per group nested in
//!   another. mink registers these functions wrapped ([`super::functions`]):
//!   each call computes its result's size from its arguments first and refuses more than
//!   [`MAX_FUNCTION_RESULT_BYTES`] beyond its array arguments' bytes.
//!
//! | bounded                                                   | limit                                  | when over                    |
//! |-----------------------------------------------------------|----------------------------------------|------------------------------|
//! | the text of one statement                                 | [`MAX_STATEMENT_BYTES`] (16 MiB)       | refused (`INVALID_ARGUMENT`) |
//! | operators in a chain, plus brackets around it              | [`MAX_EXPRESSION_DEPTH`] (2 048)       | refused (`INVALID_ARGUMENT`) |
//! | the result of one call of `repeat`, `lpad`, `rpad`, `replace`, `regexp_replace`, `regexp_match`, `array_repeat`, `array_resize`, `range`, `generate_series` (over a batch of rows) | [`MAX_FUNCTION_RESULT_BYTES`] (64 MiB) beyond its array arguments' bytes | refused (`RESOURCE_EXHAUSTED`) |
//! | the stack of a thread planning or running statements       | [`STATEMENT_STACK_BYTES`] (64 MiB)     | (a size, not a refusal)      |

/// The longest statement text: a 100 000-literal `IN` list is about 1 MiB. Tokens take
/// about forty times the bytes of their text, so this also bounds the memory of the
/// tokens a statement is measured on.
pub const MAX_STATEMENT_BYTES: usize = 16 << 20;

/// The deepest expression of a statement, counted on its tokens ([`super::depth`]):
/// each operator of a chain adds one (`c = 0 OR c = 1` counts three), each pair of
/// brackets around it one. A 1 000-term `OR` list of comparisons counts about 2 000.
///
/// Measured in a debug build (frames are smaller in a release one): `SELECT 1+1+...+1`
/// plans and runs with 4 096 terms on an 8 MiB stack and overflows it with 10 000; with
/// 10 000 terms it runs on 16 MiB and overflows it with 20 000. On the
/// [`STATEMENT_STACK_BYTES`] of 64 MiB that is about 30 times this bound. Planning time
/// grows faster than the chain (4 096 terms: 14 s in a debug build, 10 000: 80 s), which
/// is the other reason the bound is no higher.
pub const MAX_EXPRESSION_DEPTH: usize = 2048;

/// The most one call of a function whose result is sized by an argument may produce
/// over the rows of one batch, beyond the bytes of its array arguments (a result the
/// size of its input is as bounded as the input).
pub const MAX_FUNCTION_RESULT_BYTES: u64 = 64 << 20;

/// The stack of every thread of mink's runtime, where statements are planned and run
/// (tokio's default is 2 MiB). Only the pages a thread touches take memory.
pub const STATEMENT_STACK_BYTES: usize = 64 << 20;
