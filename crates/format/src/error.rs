//! The error every decoder in this crate returns.

use std::fmt;

/// Why bytes read from the device were not accepted as a structure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    Truncated { what: &'static str, need: usize, have: usize },
    /// The magic number is not the one this structure carries.
    BadMagic { what: &'static str, found: u64 },
    /// A version this build does not know; written by a newer Granary.
    UnsupportedVersion { what: &'static str, found: u32, supported: u32 },
    /// A checksum did not match: torn write or corruption.
    Checksum { what: &'static str, stored: u32, computed: u32 },
    /// A field holds a value outside its documented range.
    BadField { what: &'static str, field: &'static str, value: u64 },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Truncated { what, need, have } => {
                write!(f, "{what}: truncated, need {need} bytes, have {have}")
            }
            FormatError::BadMagic { what, found } => {
                write!(f, "{what}: bad magic {found:#x} (not a Granary structure)")
            }
            FormatError::UnsupportedVersion { what, found, supported } => write!(
                f,
                "{what}: format version {found} is not supported (this build reads version {supported}); \
                 use a newer granary"
            ),
            FormatError::Checksum { what, stored, computed } => write!(
                f,
                "{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): \
                 torn write or corruption"
            ),
            FormatError::BadField { what, field, value } => {
                write!(f, "{what}: field {field} has invalid value {value}")
            }
        }
    }
}

impl std::error::Error for FormatError {}
