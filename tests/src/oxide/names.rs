//! Server-side validation of names, hostnames and `NameOrId` selectors, with omicron's
//! messages.
//!
//! The SDK's `Name` regex lets uppercase letters through after the first character; nexus
//! refuses them when it parses the request, so the simulator checks every name it receives
//! here and reports failures as parse errors (400 without an error code).

use uuid::Uuid;

/// A resource selector: an id or a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ref {
    /// By id.
    Id(Uuid),
    /// By (validated) name.
    Name(String),
}

impl std::fmt::Display for Ref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ref::Id(id) => write!(f, "{id}"),
            Ref::Name(n) => f.write_str(n),
        }
    }
}

/// Checks `s` against omicron's `Name` rules.
pub fn check_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name requires at least one character".into());
    }
    if s.len() > 63 {
        return Err("name may contain at most 63 characters".into());
    }
    let mut chars = s.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_lowercase()) {
        return Err("name must begin with an ASCII lowercase character".into());
    }
    for c in chars {
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
            return Err(format!(
                "name contains invalid character: \"{c}\" (allowed characters are lowercase \
                 ASCII, digits, and \"-\")"
            ));
        }
    }
    if s.ends_with('-') {
        return Err("name cannot end with \"-\"".into());
    }
    if Uuid::parse_str(s).is_ok() {
        return Err("name cannot be a UUID to avoid ambiguity with IDs".into());
    }
    Ok(())
}

/// Parses a `NameOrId` given as a string (path or query parameter).
pub fn parse_ref(s: &str) -> Result<Ref, String> {
    if let Ok(id) = Uuid::parse_str(s) {
        return Ok(Ref::Id(id));
    }
    check_name(s).map(|()| Ref::Name(s.to_owned()))
}

/// Converts a `NameOrId` from a request body, applying the server's name rules.
pub fn body_ref(r: &oxide::types::NameOrId) -> Result<Ref, String> {
    match r {
        oxide::types::NameOrId::Id(id) => Ok(Ref::Id(*id)),
        oxide::types::NameOrId::Name(n) => check_name(n).map(|()| Ref::Name(n.to_string())),
    }
}

/// Checks an RFC 1035 hostname: dot-separated labels of `[a-zA-Z0-9-]`, 1–63 characters,
/// starting with a letter or digit and not ending in `-`; at most 253 characters in total.
pub fn check_hostname(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("hostname must not be empty".into());
    }
    if s.len() > 253 {
        return Err("hostname may contain at most 253 characters".into());
    }
    for label in s.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "hostname label \"{label}\" must be 1 to 63 characters"
            ));
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!(
                "hostname label \"{label}\" contains invalid characters"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "hostname label \"{label}\" may not start or end with \"-\""
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_omicron_rules() {
        for ok in ["a", "web-1", "a1-b2", &"a".repeat(63)] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "-a",
            "a-",
            "aB",
            "Abc",
            "a_b",
            "a.b",
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        // A UUID is never a name.
        let id = Uuid::new_v4().to_string();
        assert!(check_name(&id).is_err());
        assert_eq!(parse_ref(&id), Ok(Ref::Id(id.parse().unwrap())));
    }

    #[test]
    fn hostnames_follow_rfc_1035() {
        for ok in ["a", "Node-1", "a.b.c", "x1.example.com"] {
            assert_eq!(check_hostname(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a..b", "-a", "a-", "a_b", ".a", &"a".repeat(64)] {
            assert!(check_hostname(bad).is_err(), "{bad}");
        }
    }
}
