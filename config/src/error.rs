//! Errors of loading a config file: every one names the file, the line and
//! column, the field (as a path like `services[2].scheduler`) and what is
//! allowed.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// One problem in a config file, located.
///
/// Displays as `FILE:LINE:COLUMN: FIELD: MESSAGE` (the field is omitted for
/// syntax errors, which belong to no field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the operator named it.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// Field path (`services[2].backends[0].weight`); empty for syntax
    /// errors.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in one file, in file order (at least one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Invalid {
    /// The problems, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Why a config file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// {path}: cannot read: {source}
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// Turns byte offsets of one text into 1-based (line, column) positions,
/// columns counted in characters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Locator<'a> {
    text: &'a str,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Locator { text }
    }

    /// Position of the start of `span`; offsets past the end or inside a
    /// character clamp to a valid position.
    pub(crate) fn position(&self, span: &Range<usize>) -> (usize, usize) {
        let mut at = span.start.min(self.text.len());
        while !self.text.is_char_boundary(at) {
            at -= 1;
        }
        let before = &self.text[..at];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_in_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        let l = Locator::new(text);
        assert_eq!(l.position(&(0..1)), (1, 1));
        assert_eq!(l.position(&(6..7)), (2, 1));
        let x = text.find('"').unwrap();
        assert_eq!(l.position(&(x..x + 1)), (2, 6));
        assert_eq!(l.position(&(999..999)), (3, 1));
    }

    #[test]
    fn display_omits_an_empty_field() {
        let mut d = Diagnostic {
            file: "xvs.toml".into(),
            line: 3,
            column: 7,
            field: String::new(),
            message: "expected `=`".into(),
        };
        assert_eq!(d.to_string(), "xvs.toml:3:7: expected `=`");
        d.field = "services[0].port".into();
        assert_eq!(
            d.to_string(),
            "xvs.toml:3:7: services[0].port: expected `=`"
        );
    }
}
