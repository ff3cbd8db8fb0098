//! Change types of a primary-key table's changelog.
//!
//! An upsert of a new key is `+I`; an upsert that changes an existing key is `-U` (the old
//! row) followed by `+U` (the new row); a delete is `-D` carrying the old row. Append-only
//! (log) tables have no change vector: every row is an insert.

use std::fmt;

use crate::{CoreError, Result};

/// One row's change in a changelog, stored as one byte per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChangeType {
    /// `+I`: a new key.
    Insert = 0,
    /// `-U`: the row an update replaced.
    UpdateBefore = 1,
    /// `+U`: the row an update wrote.
    UpdateAfter = 2,
    /// `-D`: the row a delete removed.
    Delete = 3,
}

impl ChangeType {
    /// Whether the row is live after this change (`+I`, `+U`).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Insert | Self::UpdateAfter)
    }

    /// The short form used in `_change_type` columns: `+I`, `-U`, `+U`, `-D`.
    pub fn short_string(self) -> &'static str {
        match self {
            Self::Insert => "+I",
            Self::UpdateBefore => "-U",
            Self::UpdateAfter => "+U",
            Self::Delete => "-D",
        }
    }

    /// Decodes one byte of a change vector.
    pub fn from_byte(byte: u8) -> Result<Self> {
        match byte {
            0 => Ok(Self::Insert),
            1 => Ok(Self::UpdateBefore),
            2 => Ok(Self::UpdateAfter),
            3 => Ok(Self::Delete),
            other => Err(CoreError::InvalidRequest(format!(
                "unknown change type byte {other}"
            ))),
        }
    }

    /// Decodes a whole change vector.
    pub fn decode_vector(bytes: &[u8]) -> Result<Vec<Self>> {
        bytes.iter().map(|b| Self::from_byte(*b)).collect()
    }
}

impl fmt::Display for ChangeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        for change in [
            ChangeType::Insert,
            ChangeType::UpdateBefore,
            ChangeType::UpdateAfter,
            ChangeType::Delete,
        ] {
            assert_eq!(ChangeType::from_byte(change as u8).unwrap(), change);
        }
        assert!(ChangeType::from_byte(4).is_err());
    }

    #[test]
    fn liveness_and_display() {
        assert!(ChangeType::Insert.is_live());
        assert!(ChangeType::UpdateAfter.is_live());
        assert!(!ChangeType::UpdateBefore.is_live());
        assert!(!ChangeType::Delete.is_live());
        assert_eq!(ChangeType::UpdateBefore.to_string(), "-U");
    }
}
