//! Request bodies as dropshot parses them into nexus's types, and its 400 when that fails:
//! "unable to parse JSON body: ", the path of the field that failed (`rules[0].filters: `),
//! serde's message and its position.
//!
//! The simulator parses into the SDK's types, which differ from nexus's in two ways that show
//! in the message: the SDK's `Name` refuses a bad name by its pattern where nexus's says what
//! is wrong (omicron `common/src/api/external/mod.rs` `Name::try_from`), and nexus's create
//! bodies flatten `IdentityMetadataCreateParams` (`name`, `description`), which serde reads
//! after the rest of the object: an error there carries no path and the position of the
//! object's closing brace. Not here: the checks nexus makes after parsing (the handlers').

use oxide::types;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;
use serde_path_to_error::Segment;

use super::error::ApiError;
use super::names;

/// `body` as `T`, failing with dropshot's message.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| ApiError::bad_body(in_nexus_words(&e, body)))?;
    // Stricter than dropshot, which never calls `end`: trailing bytes are refused.
    de.end().map_err(ApiError::bad_body)?;
    Ok(value)
}

/// `body` as `T`, a create body whose nexus type flattens `IdentityMetadataCreateParams`.
/// Nexus's `Name` also refuses what the SDK's lets through (an uppercase letter after the
/// first), which is checked here, where nexus's parse would refuse it.
pub fn parse_create<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = match serde_path_to_error::deserialize(&mut de) {
        Ok(value) => value,
        Err(e) if is_identity(e.path()) => {
            let inner = e.inner();
            let position = format!(" at line {} column {}", inner.line(), inner.column());
            let words = inner.to_string();
            let words = words.strip_suffix(&position).unwrap_or(&words);
            let doc: Option<Value> = serde_json::from_slice(body).ok();
            let words = match doc.as_ref().and_then(|d| d.get("name")) {
                Some(name) => swap_name_words(words, name),
                None => words.to_owned(),
            };
            return Err(ApiError::bad_body(format!("{words}{}", object_end(body))));
        }
        Err(e) => return Err(ApiError::bad_body(in_nexus_words(&e, body))),
    };
    de.end().map_err(ApiError::bad_body)?;
    let doc: Value = serde_json::from_slice(body).map_err(ApiError::bad_body)?;
    if let Some(Err(words)) = doc
        .get("name")
        .and_then(Value::as_str)
        .map(names::check_name)
    {
        return Err(ApiError::bad_body(format!("{words}{}", object_end(body))));
    }
    Ok(value)
}

/// Whether `path` is a field of the flattened identity: `name` or `description` at the top.
fn is_identity(path: &serde_path_to_error::Path) -> bool {
    let mut segments = path.iter();
    matches!(
        (segments.next(), segments.next()),
        (Some(Segment::Map { key }), None) if key == "name" || key == "description"
    )
}

/// serde_json's " at line L column C" for the end of the body's top-level value (its closing
/// brace), counted as serde_json counts: lines from 1, bytes since the last newline.
fn object_end(body: &[u8]) -> String {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<IgnoredAny>();
    let _ = values.next();
    let end = values.byte_offset();
    let before = body.get(..end).unwrap_or(body);
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count();
    format!(" at line {line} column {column}")
}

/// dropshot's message for `err`, with nexus's words for a name the SDK refused.
fn in_nexus_words(err: &serde_path_to_error::Error<serde_json::Error>, body: &[u8]) -> String {
    let message = err.to_string();
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return message;
    };
    // The failing field, or the deepest value of its path that can be found (serde loses the
    // path inside internally tagged and untagged enums).
    let mut at = &doc;
    for segment in err.path() {
        let next = match segment {
            Segment::Seq { index } => at.get(index),
            Segment::Map { key } | Segment::Enum { variant: key } => at.get(key),
            Segment::Unknown => None,
        };
        match next {
            Some(v) => at = v,
            None => break,
        }
    }
    swap_name_words(&message, at)
}

/// `message` with the SDK's words for a refused name swapped for nexus's, when exactly one
/// string under `value` is a name the SDK refuses with words `message` holds.
fn swap_name_words(message: &str, value: &Value) -> String {
    let mut refused = Vec::new();
    refused_names(value, message, &mut refused);
    refused.sort();
    refused.dedup();
    match refused.as_slice() {
        [(sdk, nexus)] => message.replacen(sdk.as_str(), nexus, 1),
        _ => message.to_owned(),
    }
}

/// The SDK's and nexus's words for each string under `value` that the SDK's `Name` refuses
/// with words `message` holds.
fn refused_names(value: &Value, message: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(s) => {
            if let Err(sdk) = s.parse::<types::Name>()
                && let sdk = sdk.to_string()
                && message.contains(&sdk)
                && let Err(nexus) = names::check_name(s)
            {
                out.push((sdk, nexus));
            }
        }
        Value::Array(items) => {
            for v in items {
                refused_names(v, message, out);
            }
        }
        Value::Object(fields) => {
            for v in fields.values() {
                refused_names(v, message, out);
            }
        }
        _ => {}
    }
}
