//! The shape of the file: TOML syntax, keys, types and keywords, read by
//! serde; its errors are rewritten into the project's style.

use std::ops::Range;

use serde_path_to_error::Segment;

use crate::raw::RawFile;

/// Reads the shape of the file; on failure, the span, field path and
/// message of the first problem.
pub(super) fn read_raw(text: &str) -> Result<RawFile, (Range<usize>, String, String)> {
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        (span, String::new(), e.message().to_owned())
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let mut field = field_path(e.path());
        let inner = e.into_inner();
        let span = inner.span().unwrap_or(0..0);
        let message = serde_message(inner.message(), &mut field);
        (span, field, message)
    })
}

/// Renders a serde path as `services[2].scheduler`, dropping the internal
/// segments of `toml::Spanned`.
fn field_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if key.starts_with("$__serde_spanned") => {}
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// Rewrites serde's messages into the project's style (quotes, not
/// backticks; "expected X, found Y"); a missing field moves into the path.
fn serde_message(message: &str, field: &mut String) -> String {
    let unquote = |s: &str| s.replace('`', "");
    if let Some(rest) = message.strip_prefix("missing field ") {
        if !field.is_empty() {
            field.push('.');
        }
        field.push_str(&unquote(rest));
        return "required field is missing".to_owned();
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (name, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let name = unquote(name);
        return match expected {
            "" | "there are no fields" => format!("unknown field \"{name}\""),
            _ => format!("unknown field \"{name}\" (expected {})", unquote(expected)),
        };
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            let expected = match expected {
                "i64" | "u16" | "u32" | "an integer" => "an integer",
                "a boolean" | "bool" => "true or false",
                "a sequence" => "an array",
                "a borrowed string" | "a string" => "a string",
                e if e.starts_with("struct ") || e.starts_with("a map") => "a table",
                e => e,
            };
            return format!("expected {expected}, found {}", unquote(found));
        }
    }
    message.to_owned()
}
