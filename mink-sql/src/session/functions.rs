//! DataFusion's functions whose result is sized by an argument's value, wrapped so that
//! a call computes the size first and refuses more than [`MAX_FUNCTION_RESULT_BYTES`]
//! beyond the bytes of its array arguments.
//!
//! `repeat('x', 1099511627776)` is 18 bytes of SQL, and DataFusion answers it by asking for
//! one allocation of a terabyte: the allocation fails and the process aborts. So do
//! `array_repeat`, `range`, `generate_series`, and `lpad`, `rpad`, `array_resize` and
//! `replace` up to gigabytes a row. The other built-in functions' results are bounded by
//! the size of their inputs (`concat`, `concat_ws`, `overlay`, `translate`, `to_hex`,
//! `encode`, `substr_index`, `btrim`, `string_to_array`, `to_char`, ...), except two,
//! wrapped too: `regexp_replace(repeat('x', 10000000), '', repeat('y', 10000000), 'g')`
//! replaces ten million empty matches with ten million bytes each, and `regexp_match`'s
//! groups copy its text as many times as they nest (`((x*))` twice). The table functions
//! `range` and `generate_series` produce their rows a batch at a time.
//!
//! [`sized_functions`] wraps each of these functions of a registry in a [`SizedResult`],
//! to register in its place. The wrapper delegates everything to DataFusion's function
//! but, before each call, adds up over the call's rows the size its arguments ask for
//! ([`Sizing`]) and refuses the call when that is more than the bound beyond the bytes of
//! the call's array arguments (a `replace` over a batch of long strings is as large as
//! the batch, already in memory; what a value asks for on top of it is not), with
//! `ResourcesExhausted` naming the function. The optimizer folds constant calls through
//! the registered function too, so an `EXPLAIN` of such a call is refused the same way.
//!
//! The sizes are upper bounds from the arguments alone: a string's bytes times a count
//! (`repeat`), four bytes a character (`lpad`, `rpad`), one `to` string per match a
//! `from` string can have (`replace`), an element's bytes and an 8-byte index per
//! element (`array_repeat`, `array_resize`), 8 bytes per value of a series, whose step is
//! taken at its shortest (a month as 28 days, a day as 23 hours).
//!
//! `regexp_replace`'s size comes from its pattern's shortest match, read by
//! `regex-syntax` from the pattern as DataFusion compiles it (its flags but `g` in front),
//! see [`RegexpReplace`]: a text of `n` bytes has at most `n / shortest` matches, or
//! `n + 1` when the pattern matches the empty string, and at most one without the `g`
//! flag. Each match adds its replacement's bytes, less the shortest match it takes out
//! when the replacement has no group reference; a group reference in the replacement (`\1`, `$1`, `${name}`) copies part of a match,
//! and as matches do not overlap, each reference copies at most the text over all of
//! them. So `'\s+'` replaced by `' '` is sized at its text, whatever the text.
//! `regexp_match`'s size is its text times the groups nested in each other ([`Groups`]).

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, PrimitiveArray, StringArray};
use arrow::compute::cast;
use arrow::compute::kernels::length::length;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, FieldRef, Int64Type, IntervalMonthDayNano,
    IntervalMonthDayNanoType, TimeUnit,
};
use datafusion::common::ExprSchema;
use datafusion::common::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature,
};

use regex_syntax::hir::{Hir, HirKind};

use super::limits::MAX_FUNCTION_RESULT_BYTES;

/// The functions wrapped, by name, and how each one's result is sized.
const SIZED_FUNCTIONS: [(&str, Sizing); 10] = [
    ("repeat", Sizing::Repeat),
    ("lpad", Sizing::Pad),
    ("rpad", Sizing::Pad),
    ("replace", Sizing::Replace),
    ("regexp_replace", Sizing::RegexpReplace),
    ("regexp_match", Sizing::RegexpMatch),
    ("array_repeat", Sizing::ArrayRepeat),
    ("array_resize", Sizing::ArrayResize),
    ("range", Sizing::Series),
    ("generate_series", Sizing::Series),
];

/// Bytes a character takes at most in UTF-8.
const CHARACTER_BYTES: u128 = 4;

/// Bytes of a series value, and of the index by which an array function repeats an
/// element.
const VALUE_BYTES: u128 = 8;

/// Nanoseconds of the shortest day (a day that loses an hour to daylight saving).
const SHORTEST_DAY_NANOS: i128 = 23 * 3600 * 1_000_000_000;

/// Days of the shortest month.
const SHORTEST_MONTH_DAYS: i128 = 28;

/// An interval's step over dates, in days (DataFusion ignores its nanoseconds there).
const DATE_STEP: IntervalUnits = IntervalUnits {
    month: SHORTEST_MONTH_DAYS,
    day: 1,
    nanosecond: 0,
};

/// An interval's step over timestamps, in nanoseconds.
const TIMESTAMP_STEP: IntervalUnits = IntervalUnits {
    month: SHORTEST_MONTH_DAYS * SHORTEST_DAY_NANOS,
    day: SHORTEST_DAY_NANOS,
    nanosecond: 1,
};

/// [`SizedResult`] wrappers of the functions of `registry` whose result an argument
/// sizes (see the module docs), to register in its place: a function missing from
/// `registry`, or wrapped already, has none.
pub fn sized_functions(registry: &dyn FunctionRegistry) -> Vec<ScalarUDF> {
    SIZED_FUNCTIONS
        .into_iter()
        .filter_map(|(name, sizing)| {
            let inner = registry.udf(name).ok()?;
            let wrapped = inner.inner().as_any().is::<SizedResult>();
            (!wrapped).then(|| ScalarUDF::new_from_impl(SizedResult { inner, sizing }))
        })
        .collect()
}

/// How the result of a function is sized by its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Sizing {
    /// `repeat(text, count)`: the text's bytes, `count` times.
    Repeat,
    /// `lpad`/`rpad(text, length[, fill])`: `length` characters.
    Pad,
    /// `replace(text, from, to)`: the text, and `to` for every match of `from`.
    Replace,
    /// `regexp_replace(text, pattern, replacement[, flags])`: the text, and the
    /// replacement for every match of the pattern (see [`RegexpReplace`]).
    RegexpReplace,
    /// `regexp_match(text, pattern[, flags])`: the groups of the first match (see
    /// [`Groups`]).
    RegexpMatch,
    /// `array_repeat(element, count)`: the element, `count` times.
    ArrayRepeat,
    /// `array_resize(array, length[, value])`: `length` elements of the array or the value.
    ArrayResize,
    /// `range`/`generate_series([start, ]stop[, step])`: a value per step.
    Series,
}

/// The bytes one row of a call produces at most.
type RowBytes = Box<dyn Fn(usize) -> Result<u128>>;

impl Sizing {
    /// The bytes a call over `rows` rows with `args` produces at most: over one row when
    /// every argument is a scalar (the function then runs once).
    fn result_bytes(self, args: &[ColumnarValue], rows: usize) -> Result<u128> {
        let rows = if args
            .iter()
            .all(|arg| matches!(arg, ColumnarValue::Scalar(_)))
        {
            1
        } else {
            rows
        };
        let per_row = self.row_bytes(args)?;
        (0..rows).try_fold(
            0,
            |total: u128, row| Ok(total.saturating_add(per_row(row)?)),
        )
    }

    fn row_bytes(self, args: &[ColumnarValue]) -> Result<RowBytes> {
        Ok(match (self, args) {
            (Self::Repeat, [text, count]) => {
                let (text, count) = (Values::byte_lengths(text)?, Values::integers(count)?);
                Box::new(move |row| Ok(text.size(row) * count.size(row)))
            }
            (Self::Pad, [_, length, ..]) => {
                let length = Values::integers(length)?;
                Box::new(move |row| Ok(length.size(row) * CHARACTER_BYTES))
            }
            (Self::Replace, [text, from, to]) => {
                let text = Values::byte_lengths(text)?;
                let (from, to) = (Values::byte_lengths(from)?, Values::byte_lengths(to)?);
                Box::new(move |row| {
                    let (text, from, to) = (text.size(row), from.size(row), to.size(row));
                    // An empty `from` matches around every character and takes nothing
                    // out; any other match takes out its own bytes.
                    Ok(match from {
                        0 => text + (text + 1) * to,
                        from => text + text / from * to.saturating_sub(from),
                    })
                })
            }
            (Self::RegexpReplace, [text, pattern, replacement, flags @ ..]) => {
                let text = Values::byte_lengths(text)?;
                let replace = RegexpReplace::of(pattern, replacement, flags.first())?;
                Box::new(move |row| Ok(replace.result_bytes(row, text.size(row))))
            }
            (Self::RegexpMatch, [text, pattern, flags @ ..]) => {
                let text = Values::byte_lengths(text)?;
                let groups = Patterns::of(pattern, flags.first(), Groups::of)?;
                Box::new(move |row| {
                    let groups = groups.get(row).unwrap_or(Groups::WHOLE_MATCH);
                    Ok(groups.result_bytes(text.size(row)))
                })
            }
            (Self::ArrayRepeat, [element, count]) => {
                let (element, count) = (Values::bytes(element)?, Values::integers(count)?);
                Box::new(move |row| Ok(count.size(row) * (element.size(row) + VALUE_BYTES)))
            }
            (Self::ArrayResize, [array, length, value @ ..]) => {
                let (bytes, elements) = (Values::bytes(array)?, Values::byte_lengths(array)?);
                let length = Values::integers(length)?;
                let value = value.first().map(Values::bytes).transpose()?;
                Box::new(move |row| {
                    let element = bytes.size(row) / elements.size(row).max(1);
                    let value = value.as_ref().map_or(0, |value| value.size(row));
                    Ok(length.size(row) * (element + value + VALUE_BYTES))
                })
            }
            (Self::Series, args) => {
                let Some(series) = Series::of(args)? else {
                    return Ok(Box::new(|_| Ok(0)));
                };
                Box::new(move |row| Ok(series.values(row)? * VALUE_BYTES))
            }
            (sizing, args) => {
                return Err(DataFusionError::Plan(format!(
                    "{sizing:?}: {} arguments, which the function does not take",
                    args.len()
                )));
            }
        })
    }
}

/// The arguments of a `range`/`generate_series` call, as integers: days for dates,
/// nanoseconds for timestamps.
struct Series {
    /// `None` for `range(stop)`, which starts at 0.
    start: Option<Values<Int64Type>>,
    stop: Values<Int64Type>,
    step: Step,
}

/// The step of a series.
enum Step {
    /// No step given: one.
    One,
    Integers(Values<Int64Type>),
    Interval(Values<IntervalMonthDayNanoType>, IntervalUnits),
}

impl Series {
    fn of(args: &[ColumnarValue]) -> Result<Option<Self>> {
        let Some(first) = args.first() else {
            return Ok(None);
        };
        Ok(Some(match (first.data_type(), args) {
            (DataType::Null, _) => return Ok(None), // DataFusion answers null
            (DataType::Int64, [stop]) => Self {
                start: None,
                stop: Values::integers(stop)?,
                step: Step::One,
            },
            (DataType::Int64, [start, stop]) => Self {
                start: Some(Values::integers(start)?),
                stop: Values::integers(stop)?,
                step: Step::One,
            },
            (DataType::Int64, [start, stop, step]) => Self {
                start: Some(Values::integers(start)?),
                stop: Values::integers(stop)?,
                step: Step::Integers(Values::integers(step)?),
            },
            (DataType::Date32 | DataType::Date64, [start, stop, step]) => Self {
                start: Some(Values::days(start)?),
                stop: Values::days(stop)?,
                step: Step::Interval(Values::of(step)?, DATE_STEP),
            },
            (DataType::Timestamp(..), [start, stop, step]) => Self {
                start: Some(Values::nanoseconds(start)?),
                stop: Values::nanoseconds(stop)?,
                step: Step::Interval(Values::of(step)?, TIMESTAMP_STEP),
            },
            (other, args) => {
                return Err(DataFusionError::Plan(format!(
                    "a series of {other} with {} arguments",
                    args.len()
                )));
            }
        }))
    }

    /// How many values the series of `row` has at most: its span over its shortest step,
    /// plus one; none when an argument is null, the step is zero (DataFusion refuses it)
    /// or goes the other way.
    fn values(&self, row: usize) -> Result<u128> {
        let start = match &self.start {
            Some(start) => start.get(row),
            None => Some(0),
        };
        let (Some(start), Some(stop), Some(step)) = (start, self.stop.get(row), self.step(row)?)
        else {
            return Ok(0);
        };
        let span = i128::from(stop) - i128::from(start);
        if step == 0 || span.signum() * step.signum() < 0 {
            return Ok(0);
        }
        Ok(span.unsigned_abs() / step.unsigned_abs() + 1)
    }

    fn step(&self, row: usize) -> Result<Option<i128>> {
        match &self.step {
            Step::One => Ok(Some(1)),
            Step::Integers(steps) => Ok(steps.get(row).map(i128::from)),
            Step::Interval(steps, units) => {
                steps.get(row).map(|step| units.least(step)).transpose()
            }
        }
    }
}

/// What a month, a day and a nanosecond of an interval step over a series at least.
#[derive(Debug, Clone, Copy)]
struct IntervalUnits {
    month: i128,
    day: i128,
    nanosecond: i128,
}

impl IntervalUnits {
    /// The least an interval steps: its parts at their shortest, added up.
    ///
    /// # Errors
    /// Parts of opposite signs (`1 month - 30 days`): such a step can be nothing or go
    /// back and forth, so the series has no bound.
    fn least(self, interval: IntervalMonthDayNano) -> Result<i128> {
        let parts = [
            i128::from(interval.months) * self.month,
            i128::from(interval.days) * self.day,
            i128::from(interval.nanoseconds) * self.nanosecond,
        ];
        if parts.iter().any(|part| *part > 0) && parts.iter().any(|part| *part < 0) {
            return Err(DataFusionError::Plan(
                "a series whose step has parts of opposite signs (such as 1 month - 30 \
                 days) has no bound on its length: give a step of one sign"
                    .into(),
            ));
        }
        Ok(parts.iter().sum())
    }
}

/// An argument's values as an array, and whether it is a scalar: an array of one value
/// every row reads.
fn rows_of(value: &ColumnarValue) -> Result<(ArrayRef, bool)> {
    Ok(match value {
        ColumnarValue::Array(array) => (Arc::clone(array), false),
        ColumnarValue::Scalar(value) => (value.to_array_of_size(1)?, true),
    })
}

/// The row of an argument's array that `row` of the call reads.
fn row_of(row: usize, scalar: bool) -> usize {
    if scalar { 0 } else { row }
}

/// An argument's values, one per row of the call (a scalar is one value every row reads).
struct Values<T: ArrowPrimitiveType> {
    values: PrimitiveArray<T>,
    scalar: bool,
}

impl<T: ArrowPrimitiveType> Values<T> {
    /// The values of an argument of type `T`.
    fn of(value: &ColumnarValue) -> Result<Self> {
        Self::converted(value, |array| Ok(Arc::clone(array)))
    }

    /// The values of an argument, `convert`ed and cast to `T`.
    fn converted(
        value: &ColumnarValue,
        convert: impl Fn(&ArrayRef) -> Result<ArrayRef>,
    ) -> Result<Self> {
        let (array, scalar) = rows_of(value)?;
        let values = cast(&convert(&array)?, &T::DATA_TYPE)?
            .as_primitive::<T>()
            .clone();
        Ok(Self { values, scalar })
    }

    /// The value of `row`, `None` where it is null.
    fn get(&self, row: usize) -> Option<T::Native> {
        let row = row_of(row, self.scalar);
        self.values.is_valid(row).then(|| self.values.value(row))
    }
}

impl Values<Int64Type> {
    fn integers(value: &ColumnarValue) -> Result<Self> {
        Self::of(value)
    }

    /// The bytes of each string or binary value, the elements of each list.
    fn byte_lengths(value: &ColumnarValue) -> Result<Self> {
        Self::converted(value, |array| Ok(length(array)?))
    }

    /// The bytes each value takes in memory.
    fn bytes(value: &ColumnarValue) -> Result<Self> {
        Self::converted(value, |array| {
            let sizes = (0..array.len())
                .map(|row| {
                    let size = array.slice(row, 1).to_data().get_slice_memory_size()?;
                    Ok(i64::try_from(size).unwrap_or(i64::MAX))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(Int64Array::from(sizes)))
        })
    }

    /// Dates as days since the epoch.
    fn days(value: &ColumnarValue) -> Result<Self> {
        Self::converted(value, |array| {
            Ok(cast(&cast(array, &DataType::Date32)?, &DataType::Int32)?)
        })
    }

    /// Timestamps as nanoseconds since the epoch.
    fn nanoseconds(value: &ColumnarValue) -> Result<Self> {
        Self::converted(value, |array| match array.data_type() {
            DataType::Timestamp(_, zone) => Ok(cast(
                array,
                &DataType::Timestamp(TimeUnit::Nanosecond, zone.clone()),
            )?),
            other => Err(DataFusionError::Plan(format!("{other} is not a timestamp"))),
        })
    }

    /// The value of `row` as a size: none where it is null or negative.
    fn size(&self, row: usize) -> u128 {
        self.get(row)
            .and_then(|value| u128::try_from(value).ok())
            .unwrap_or(0)
    }
}

/// A string argument's values, one per row of the call (a scalar is one value every row
/// reads).
struct Strings {
    values: StringArray,
    scalar: bool,
}

impl Strings {
    fn of(value: &ColumnarValue) -> Result<Self> {
        let (array, scalar) = rows_of(value)?;
        let values = cast(&array, &DataType::Utf8)?.as_string::<i32>().clone();
        Ok(Self { values, scalar })
    }

    /// The value of `row`, `None` where it is null.
    fn get(&self, row: usize) -> Option<&str> {
        let row = row_of(row, self.scalar);
        self.values.is_valid(row).then(|| self.values.value(row))
    }
}

/// What each row's pattern, with its flags, is to a call: one for every row when both
/// are scalars. `None` where the pattern or the flags are null, or where the parse
/// gives none: the pattern does not parse (DataFusion then refuses it with its own
/// error), or cannot match anything.
struct Patterns<T> {
    parsed: Vec<Option<T>>,
    scalar: bool,
}

impl<T: Copy> Patterns<T> {
    /// Each row's `pattern` with its `flags`, `parse`d.
    fn of(
        pattern: &ColumnarValue,
        flags: Option<&ColumnarValue>,
        parse: impl Fn(&str, Option<&str>) -> Option<T>,
    ) -> Result<Self> {
        let patterns = Strings::of(pattern)?;
        let flags = flags.map(Strings::of).transpose()?;
        let scalar = patterns.scalar && flags.as_ref().is_none_or(|flags| flags.scalar);
        let rows = flags
            .as_ref()
            .map_or(0, |flags| flags.values.len())
            .max(patterns.values.len());
        let parsed = (0..rows)
            .map(|row| {
                let flags = match &flags {
                    Some(flags) => Some(flags.get(row)?),
                    None => None,
                };
                parse(patterns.get(row)?, flags)
            })
            .collect();
        Ok(Self { parsed, scalar })
    }

    fn get(&self, row: usize) -> Option<T> {
        self.parsed[row_of(row, self.scalar)]
    }
}

/// The patterns and replacements of a `regexp_replace` call, which size its result row
/// by row (see the module docs).
struct RegexpReplace {
    matches: Patterns<Matches>,
    replacements: Strings,
}

/// What a pattern with its flags matches.
#[derive(Debug, Clone, Copy)]
struct Matches {
    /// The fewest bytes a match takes.
    shortest: u128,
    /// Whether every match is replaced (the `g` flag), or only the first.
    global: bool,
}

impl RegexpReplace {
    fn of(
        pattern: &ColumnarValue,
        replacement: &ColumnarValue,
        flags: Option<&ColumnarValue>,
    ) -> Result<Self> {
        Ok(Self {
            matches: Patterns::of(pattern, flags, Matches::of)?,
            replacements: Strings::of(replacement)?,
        })
    }

    /// The bytes the call produces at most for `row`, whose text has `text` bytes.
    fn result_bytes(&self, row: usize, text: u128) -> u128 {
        let Some(matches) = self.matches.get(row) else {
            return text;
        };
        let replacement = self.replacements.get(row).unwrap_or_default();
        let literal = replacement.len() as u128;
        let references = group_references(replacement);
        // Without a reference, a match takes out at least its shortest; with them, each
        // reference copies at most the text over all matches, one of them in place of
        // the match it replaces.
        let per_match = if references == 0 {
            literal.saturating_sub(matches.shortest)
        } else {
            literal
        };
        text + matches.most(text) * per_match + references.saturating_sub(1) * text
    }
}

impl Matches {
    /// What `pattern` matches, compiled as DataFusion compiles it: with the `flags` but
    /// `g` in front. `None` when it cannot match anything or does not parse.
    fn of(pattern: &str, flags: Option<&str>) -> Option<Self> {
        let (pattern, global) = match flags {
            None => (pattern.to_string(), false),
            Some("g") => (pattern.to_string(), true),
            Some(flags) => (
                format!("(?{}){pattern}", flags.replace('g', "")),
                flags.contains('g'),
            ),
        };
        let shortest = parse(&pattern)?.properties().minimum_len()?;
        Some(Self {
            shortest: shortest as u128,
            global,
        })
    }

    /// How many matches a text of `text` bytes has at most: one without the `g` flag,
    /// one at each position and the end when the pattern matches the empty string.
    fn most(self, text: u128) -> u128 {
        match (self.global, self.shortest) {
            (false, _) => 1,
            (true, 0) => text + 1,
            (true, shortest) => text / shortest,
        }
    }
}

/// What `regexp_match` copies of its first match: each group's text, or the whole match
/// when the pattern has no group. Groups side by side take different parts of the
/// match, so all of them copy at most the match as many times as groups nest in each
/// other (`((x*))` twice): `regex-syntax` bounds that nesting at 250.
#[derive(Debug, Clone, Copy)]
struct Groups {
    /// How many groups nest in each other at most, one when there is none.
    nesting: u128,
    /// How many values the list of a row holds.
    count: u128,
}

impl Groups {
    /// A pattern without groups, or one DataFusion refuses.
    const WHOLE_MATCH: Self = Self {
        nesting: 1,
        count: 1,
    };

    /// The groups of `pattern`, compiled as arrow compiles it: with the `flags` in front.
    fn of(pattern: &str, flags: Option<&str>) -> Option<Self> {
        let pattern = match flags {
            Some(flags) => format!("(?{flags}){pattern}"),
            None => pattern.to_string(),
        };
        let hir = parse(&pattern)?;
        Some(Self {
            nesting: nesting(&hir).max(1),
            count: hir.properties().explicit_captures_len().max(1) as u128,
        })
    }

    /// The bytes of a row's list over a text of `text` bytes, an offset per value.
    fn result_bytes(self, text: u128) -> u128 {
        self.nesting * text + (self.count + 1) * VALUE_BYTES
    }
}

/// How many groups of `hir` nest in each other at most.
fn nesting(hir: &Hir) -> u128 {
    match hir.kind() {
        HirKind::Capture(capture) => 1 + nesting(&capture.sub),
        HirKind::Repetition(repetition) => nesting(&repetition.sub),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => {
            parts.iter().map(nesting).max().unwrap_or(0)
        }
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => 0,
    }
}

/// A pattern as DataFusion's regular expressions read it, `None` when they refuse it.
fn parse(pattern: &str) -> Option<Hir> {
    regex_syntax::parse(pattern).ok()
}

/// How many group references a `regexp_replace` replacement has at most: every `$`
/// (`$1`, `${name}`, and twice for the literal `$$`), and every backslash before a digit
/// (`\1`, which DataFusion turns into `${1}`).
fn group_references(replacement: &str) -> u128 {
    let bytes = replacement.as_bytes();
    let dollars = bytes.iter().filter(|&&byte| byte == b'$').count();
    let backslashed = bytes
        .windows(2)
        .filter(|pair| pair[0] == b'\\' && pair[1].is_ascii_digit())
        .count();
    (dollars + backslashed) as u128
}

/// The bytes of a call's array arguments (scalars count nothing: a literal is sized
/// by the function's result alone).
fn input_bytes(args: &[ColumnarValue]) -> u128 {
    args.iter()
        .map(|arg| match arg {
            // Every buffer the array holds (a view array's data buffers too).
            ColumnarValue::Array(array) => array.get_array_memory_size() as u128,
            ColumnarValue::Scalar(_) => 0,
        })
        .sum()
}

/// A DataFusion function that refuses a call whose result would be over
/// [`MAX_FUNCTION_RESULT_BYTES`], and otherwise is the function (see the module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SizedResult {
    inner: Arc<ScalarUDF>,
    sizing: Sizing,
}

impl SizedResult {
    /// DataFusion's function.
    fn imp(&self) -> &dyn ScalarUDFImpl {
        self.inner.inner().as_ref()
    }

    /// Refuses a call whose result could be more than [`MAX_FUNCTION_RESULT_BYTES`]
    /// beyond the bytes of its arguments' arrays: a result the size of its input (a
    /// `replace` over a batch of long strings) is as bounded as the input, already in
    /// memory; what an argument's value asks for on top of it is not.
    fn check(&self, args: &ScalarFunctionArgs) -> Result<()> {
        let bytes = self.sizing.result_bytes(&args.args, args.number_rows)?;
        let input = input_bytes(&args.args);
        if bytes > u128::from(MAX_FUNCTION_RESULT_BYTES) + input {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{}() would produce up to {bytes} bytes in one call, more than mink's bound \
                 of {MAX_FUNCTION_RESULT_BYTES} bytes per call beyond its arguments' {input}: \
                 ask for fewer or shorter values",
                self.inner.name()
            )));
        }
        Ok(())
    }
}

impl ScalarUDFImpl for SizedResult {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.imp().aliases()
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        #[expect(deprecated, reason = "delegated as DataFusion's own wrappers do")]
        self.imp().display_name(args)
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.imp().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.imp().signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.imp().return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.imp().return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn ExprSchema) -> bool {
        #[expect(deprecated, reason = "delegated as DataFusion's own wrappers do")]
        self.imp().is_nullable(args, schema)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.check(&args)?;
        self.imp().invoke_with_args(args)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let inner = self.imp().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Self {
            inner: Arc::new(inner),
            sizing: self.sizing,
        }))
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.imp().simplify(args, info)
    }

    fn preimage(
        &self,
        args: &[Expr],
        lit_expr: &Expr,
        info: &SimplifyContext,
    ) -> Result<PreimageResult> {
        self.imp().preimage(args, lit_expr, info)
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.imp().conditional_arguments(args)
    }

    fn short_circuits(&self) -> bool {
        self.imp().short_circuits()
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> Result<Interval> {
        self.imp().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> Result<Option<Vec<Interval>>> {
        self.imp().propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.imp().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.imp().preserves_lex_ordering(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.imp().coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.imp().documentation()
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.imp().placement(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

    fn context() -> SessionContext {
        let context = SessionContext::new();
        for function in sized_functions(&context) {
            context.register_udf(function);
        }
        context
    }

    async fn answer(context: &SessionContext, sql: &str) -> Result<String> {
        let batches = context.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    /// Statements that asked DataFusion for an allocation of gigabytes or terabytes.
    const OVER: [(&str, &str); 11] = [
        ("SELECT array_repeat(1, 100000000000)", "array_repeat"),
        ("SELECT range(100000000000)", "range"),
        ("SELECT generate_series(1, 100000000000)", "generate_series"),
        (
            "SELECT length(repeat(arrow_cast('x', 'LargeUtf8'), 1099511627776))",
            "repeat",
        ),
        (
            "SELECT array_resize(make_array(1), 100000000000)",
            "array_resize",
        ),
        ("SELECT length(lpad('x', 2147483647))", "lpad"),
        ("SELECT length(rpad('x', 2147483647, 'yz'))", "rpad"),
        (
            "SELECT length(replace(repeat('x', 9000), 'x', repeat('y', 9000)))",
            "replace",
        ),
        (
            "SELECT length(regexp_replace(repeat('x', 1000000), '', repeat('y', 1000000), 'g'))",
            "regexp_replace",
        ),
        (
            "SELECT length(regexp_replace(repeat('x', 1000000), 'x?', repeat('y', 100), 'gi'))",
            "regexp_replace",
        ),
        (
            "SELECT range(TIMESTAMP '1970-01-01', TIMESTAMP '2100-01-01', INTERVAL '1 second')",
            "range",
        ),
    ];

    #[tokio::test]
    async fn results_over_the_bound_are_refused_even_when_folded() {
        let context = context();
        for (sql, function) in OVER {
            let error = answer(&context, sql).await.unwrap_err();
            assert!(
                matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)),
                "{sql}: {error}"
            );
            let message = error.to_string();
            assert!(message.contains(&format!("{function}()")), "{message}");
            assert!(message.contains("67108864 bytes per call"), "{message}");
            // The optimizer's folding of the call is refused too, and leaves it unfolded.
            let plan = answer(&context, &format!("EXPLAIN {sql}")).await.unwrap();
            assert!(plan.contains(&format!("{function}(")), "{plan}");
        }
    }

    #[tokio::test]
    async fn the_rows_of_a_call_add_up() {
        let context = context();
        let rows = vec!["('x')"; 64].join(", ");
        let sql = format!("SELECT length(repeat(v, 2000000000)) FROM (VALUES {rows}) t(v)");
        let error = answer(&context, &sql).await.unwrap_err();
        assert!(error.to_string().contains("repeat()"), "{error}");
        // 64 rows of 1 MiB each: 64 MiB, at the bound.
        let sql = format!("SELECT sum(length(repeat(v, 1048576))) FROM (VALUES {rows}) t(v)");
        assert!(answer(&context, &sql).await.unwrap().contains("67108864"));
    }

    #[tokio::test]
    async fn results_within_the_bound_are_datafusion_s() {
        let context = context();
        for (sql, expected) in [
            ("SELECT repeat('ab', 3) AS r", "ababab"),
            ("SELECT lpad('x', 3, 'ab') AS r", "abx"),
            ("SELECT rpad('x', 3) AS r", "x  "),
            ("SELECT replace('banana', 'a', 'oo') AS r", "boonoonoo"),
            ("SELECT array_repeat(7, 3) AS r", "[7, 7, 7]"),
            (
                "SELECT array_resize(make_array(1, 2), 3, 9) AS r",
                "[1, 2, 9]",
            ),
            ("SELECT range(3) AS r", "[0, 1, 2]"),
            ("SELECT generate_series(5, 1, -2) AS r", "[5, 3, 1]"),
            ("SELECT range(5, 1) AS r", "[]"),
            (
                "SELECT range(DATE '2024-01-01', DATE '2024-04-01', INTERVAL '1 month') AS r",
                "[2024-01-01, 2024-02-01, 2024-03-01]",
            ),
            ("SELECT length(repeat('x', 60000000)) AS r", "60000000"),
            ("SELECT cardinality(range(8000000)) AS r", "8000000"),
        ] {
            let answer = answer(&context, sql).await.unwrap();
            assert!(answer.contains(expected), "{sql}: {answer}");
        }
    }

    #[tokio::test]
    async fn regexp_replace_of_empty_matches_over_ten_megabytes_is_refused() {
        let context = context();
        let sql = "SELECT length(regexp_replace(repeat('x', 10000000), '', \
                   repeat('y', 10000000), 'g'))";
        let error = answer(&context, sql).await.unwrap_err();
        assert!(
            matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)),
            "{error}"
        );
        assert!(error.to_string().contains("regexp_replace()"), "{error}");
        // Without `g`, one match: ten megabytes more.
        let sql = "SELECT length(regexp_replace(repeat('x', 10000000), '', \
                   repeat('y', 10000000)))";
        assert!(answer(&context, sql).await.unwrap().contains("20000000"));
    }

    #[tokio::test]
    async fn regexp_replace_is_sized_by_its_shortest_match() {
        let context = context();
        // 12 000 bytes, 6 000 of them in 2 000 runs of spaces: sized at the text.
        let sql = "SELECT regexp_replace(repeat('ab   c', 2000), '\\s+', ' ', 'g') AS r";
        let replaced = answer(&context, sql).await.unwrap();
        assert!(replaced.contains(&"ab c".repeat(2000)), "{replaced}");
        // The pattern of each row: the empty one has a million matches, `x{100}` 10 000
        // that take out as much as they put in.
        let sql = "SELECT sum(length(regexp_replace(v, p, repeat('y', 100), 'g'))) \
                   FROM (VALUES (repeat('x', 1000000), 'x{100}'), (repeat('x', 1000000), '')) \
                   t(v, p)";
        let error = answer(&context, sql).await.unwrap_err();
        assert!(error.to_string().contains("regexp_replace()"), "{error}");
        let sql = sql.replace("''", "'x{200}'");
        assert!(answer(&context, &sql).await.unwrap().contains("1500000"));
    }

    #[tokio::test]
    async fn regexp_replace_s_group_references_copy_up_to_the_text_each() {
        let context = context();
        let answered = [
            (
                "SELECT regexp_replace('abc', '(b)', '\\1\\1$1') AS r",
                "abbbc",
            ),
            (
                "SELECT length(regexp_replace(repeat('xy', 1000000), '(x)(y)', '\\2\\1', 'g')) AS r",
                "2000000",
            ),
        ];
        for (sql, expected) in answered {
            let answer = answer(&context, sql).await.unwrap();
            assert!(answer.contains(expected), "{sql}: {answer}");
        }
        // One match of 2 MB, copied 40 times.
        let sql = "SELECT length(regexp_replace(repeat('x', 2000000), '.*', repeat('\\0', 40)))";
        let error = answer(&context, sql).await.unwrap_err();
        assert!(error.to_string().contains("regexp_replace()"), "{error}");
    }

    /// A pattern of `depth` groups nested in each other around `x*`.
    fn nested_groups(depth: usize) -> String {
        format!("{}x*{}", "(".repeat(depth), ")".repeat(depth))
    }

    #[tokio::test]
    async fn regexp_match_s_nested_groups_copy_the_text_each() {
        let context = context();
        let sql = |depth| {
            format!(
                "SELECT cardinality(regexp_match(repeat('x', 1000000), '{}')) AS r",
                nested_groups(depth)
            )
        };
        let error = answer(&context, &sql(70)).await.unwrap_err();
        assert!(
            matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)),
            "{error}"
        );
        assert!(error.to_string().contains("regexp_match()"), "{error}");
        assert!(answer(&context, &sql(10)).await.unwrap().contains("10"));
        // Groups side by side copy the text once.
        let sql = "SELECT regexp_match(repeat('x', 1000000) || '-2024-01-02', \
                   '-(\\d+)-(\\d+)-(\\d+)$', 'i') AS r";
        let answer = answer(&context, sql).await.unwrap();
        assert!(answer.contains("[2024, 01, 02]"), "{answer}");
    }

    #[tokio::test]
    async fn a_result_the_size_of_a_large_batch_is_answered() {
        let context = context();
        // One batch of 1 000 strings of 80 KB: 80 MB, more than the bound on its own.
        let over_long_rows = |call: &str| {
            format!(
                "SELECT sum(length({call})) AS n FROM (SELECT repeat('a', 80000) || \
                 CAST(v AS VARCHAR) AS s FROM generate_series(1000, 1999) AS t(v))"
            )
        };
        for call in ["replace(s, 'a', 'b')", "regexp_replace(s, 'a+', ' ', 'g')"] {
            let answer = answer(&context, &over_long_rows(call)).await.unwrap();
            assert!(answer.contains('|'), "{call}: {answer}");
        }
        // What an argument asks for beyond the input is still bounded.
        let error = answer(&context, &over_long_rows("repeat(s, 2)"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("repeat()"), "{error}");
    }

    #[tokio::test]
    async fn a_step_of_opposite_signs_is_refused() {
        let context = context();
        let sql = "SELECT range(DATE '2000-01-01', DATE '2001-01-01', \
                   INTERVAL '1 month' - INTERVAL '30 days')";
        let error = answer(&context, sql).await.unwrap_err().to_string();
        assert!(error.contains("opposite signs"), "{error}");
    }

    #[test]
    fn each_function_is_wrapped_once() {
        let context = context();
        assert!(sized_functions(&context).is_empty());
        for (name, _) in SIZED_FUNCTIONS {
            let function = context.udf(name).unwrap();
            assert!(function.inner().as_any().is::<SizedResult>(), "{name}");
        }
    }
}
