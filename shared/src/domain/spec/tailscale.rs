//! The Tailscale vocabulary of `spec.yaml` and the command line: the default tag, and the
//! checks of a tag and a key. The API client is [`crate::adapters::tailscale`].

/// Tag the nodes advertise unless told otherwise: the Go controller's `--tailscale-tag`
/// default (`ainekko-k8s-node`), in the `tag:` form Tailscale uses.
pub const DEFAULT_TAG: &str = "tag:ainekko-k8s-node";
/// `NAME` or `tag:NAME` → `tag:NAME` (the Go controller took the bare name and added the
/// prefix; accepting both keeps its command lines working and forgives the other habit).
pub fn normalize_tag(tag: &str) -> String {
    let tag = tag.trim();
    if tag.starts_with("tag:") {
        tag.to_owned()
    } else {
        format!("tag:{tag}")
    }
}

/// Checks a `tag:NAME` as Tailscale's ACLs accept it: a letter, then letters, digits and `-`.
pub fn check_tag(tag: &str) -> Result<(), String> {
    let name = tag
        .strip_prefix("tag:")
        .ok_or_else(|| format!("{tag:?} does not start with tag:"))?;
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{tag:?} is not a Tailscale tag (tag: then a letter, then letters, digits and '-')"
        ))
    }
}

/// Checks an auth or API key: one non-empty line without spaces (it travels in a file and an
/// HTTP header). The message never contains the key.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        Err("is empty".to_owned())
    } else if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err("contains whitespace or control characters".to_owned())
    } else {
        Ok(())
    }
}
