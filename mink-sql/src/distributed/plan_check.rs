//! What a worker checks in a plan's bytes before datafusion-distributed decodes them:
//! no Arrow IPC in it declares compression ([`check_plan`]).
//!
//! DataFusion's plan format keeps Arrow IPC in two places: a nested literal (a list,
//! struct or map `ScalarValue`, in any expression of any node) is a bare IPC message
//! header with its body, and an in-memory table (`MemoryScanExecNode`) is an IPC stream
//! per partition. arrow-ipc allocates the uncompressed length a compressed buffer
//! declares before it reads the buffer, so one forged length aborts the worker while it
//! decodes the plan, before any hook of mink's runs.
//!
//! The check walks the plan's protobuf wire format without its schema:
//!
//! ```text
//!   message := field*        field := key(varint: number << 3 | wire type) value
//!   wire type 0: varint   1: 8 bytes   5: 4 bytes   3/4: group start/end (walked flat)
//!   wire type 2: length + span  -->  the span is checked as IPC (a header, a stream),
//!                                    then walked as a message of its own
//! ```
//!
//! A span that does not parse as a message is a string or bytes, which is the end of
//! that branch; one whose first byte no message starts with (a field number of 0) is
//! also walked from its second byte, the form of mink's own extension nodes (a kind
//! byte, then a message). It is sound because every byte string the decoder reads as
//! IPC sits in a span of a message the walk reaches: the walk accepts every message
//! prost accepts (and more), descends into every span at every depth, and judges each
//! span both ways a decoder could read it. What parses as neither passes, so the check
//! never refuses a plan mink sends.

use std::fmt;

use mink_core::ipc_guard::check_embedded;

use super::limits::MAX_PLAN_NESTING;

/// Why a plan was refused before it was decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanRefused(String);

impl fmt::Display for PlanRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plan refused: {}", self.0)
    }
}

impl std::error::Error for PlanRefused {}

/// Checks the encoded plan `plan` (a `PhysicalPlanNode`) as the module docs say.
///
/// # Errors
/// A span of the plan holds Arrow IPC declaring compression; messages nest deeper than
/// [`MAX_PLAN_NESTING`].
pub(crate) fn check_plan(plan: &[u8]) -> Result<(), PlanRefused> {
    walk(plan, 0).map(|_| ())
}

/// Walks `bytes` as a message at `depth`, checking its spans: whether they parse as one.
fn walk(bytes: &[u8], depth: usize) -> Result<bool, PlanRefused> {
    let Some(spans) = spans(bytes) else {
        return Ok(false);
    };
    for span in spans {
        check_span(span, depth + 1)?;
    }
    Ok(true)
}

/// Checks a span at `depth`: as IPC, then as a message (or a kind byte and a message).
fn check_span(span: &[u8], depth: usize) -> Result<(), PlanRefused> {
    check_embedded(span).map_err(|e| PlanRefused(e.to_string()))?;
    if depth > MAX_PLAN_NESTING {
        return match !span.is_empty() && spans(span).is_some() {
            true => Err(PlanRefused(format!(
                "its messages nest deeper than {MAX_PLAN_NESTING}"
            ))),
            false => Ok(()),
        };
    }
    if walk(span, depth)? {
        return Ok(());
    }
    match span.split_first() {
        Some((&kind, message)) if kind < 8 => walk(message, depth).map(|_| ()),
        _ => Ok(()),
    }
}

/// The length-delimited spans of `bytes` read as a message, `None` when they do not
/// parse as one.
fn spans(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut spans = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (key, value) = varint(rest)?;
        rest = match (key >> 3, key & 7) {
            (0, _) => return None,
            (_, 0) => varint(value)?.1,
            (_, 1) => value.get(8..)?,
            (_, 5) => value.get(4..)?,
            (_, 3 | 4) => value,
            (_, 2) => {
                let (span, after) = length_delimited(value)?;
                spans.push(span);
                after
            }
            (_, _) => return None,
        };
    }
    Some(spans)
}

/// A length-delimited value at the start of `bytes`: its span and what follows it.
fn length_delimited(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (length, rest) = varint(bytes)?;
    let length = usize::try_from(length).ok()?;
    (length <= rest.len()).then(|| rest.split_at(length))
}

/// A varint at the start of `bytes` (at most 10 bytes) and what follows it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests;
