//! The login user's `authorized_keys` as the controller edits it when it rotates its SSH key
//! (`bootstrap rotate-ssh-key`, audit security-2 N1): add the new key, later drop the old one,
//! every other line (the person's own key, comments, options) kept as it was. Pure: text in,
//! text out.

/// The file sshd reads for `user` (its default `AuthorizedKeysFile`, `.ssh/authorized_keys`
/// under the home directory) and cloud-init wrote the user-data's keys into: users cloud-init
/// creates live in `/home/<name>`.
pub fn path(user: &str) -> String {
    format!("/home/{user}/.ssh/authorized_keys")
}

/// The key of an `authorized_keys` line or public key line: its type and base64 blob (options
/// before them and the comment after are not the key).
fn key_of(line: &str) -> Option<(&str, &str)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.windows(2).find_map(|w| {
        let known =
            w[0].starts_with("ssh-") || w[0].starts_with("ecdsa-sha2-") || w[0].starts_with("sk-");
        (known && w[1].starts_with("AAAA")).then_some((w[0], w[1]))
    })
}

/// Whether `content` holds the key of `public` (a public key line).
pub fn holds(content: &str, public: &str) -> bool {
    let Some(want) = key_of(public) else {
        return false;
    };
    content.lines().any(|l| key_of(l) == Some(want))
}

/// `content` with `public` appended unless it already holds that key.
pub fn with_key(content: &str, public: &str) -> String {
    let mut out = content.to_owned();
    if holds(content, public) {
        return out;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(public.trim());
    out.push('\n');
    out
}

/// `content` without the lines holding the key of `public`.
pub fn without_key(content: &str, public: &str) -> String {
    let Some(gone) = key_of(public) else {
        return content.to_owned();
    };
    content
        .lines()
        .filter(|l| key_of(l) != Some(gone))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOLD oxide-controller";
    const NEW: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINEW oxide-controller";
    const USER: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUSER me@laptop";

    #[test]
    fn the_new_key_is_added_once_and_the_old_one_removed_leaving_the_rest() {
        let file = format!("# keys\n{OLD}\n{USER}");
        let added = with_key(&file, NEW);
        assert_eq!(added, format!("# keys\n{OLD}\n{USER}\n{NEW}\n"));
        assert_eq!(with_key(&added, NEW), added, "idempotent");
        // The same key under another comment or with options is the same key.
        let other = "no-pty ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOLD root@elsewhere";
        let file = format!("{added}{other}\n");
        assert!(holds(&file, OLD));
        let removed = without_key(&file, OLD);
        assert_eq!(removed, format!("# keys\n{USER}\n{NEW}\n"));
        assert!(!holds(&removed, OLD) && holds(&removed, NEW));
        assert_eq!(with_key("", NEW), format!("{NEW}\n"));
        assert_eq!(path("ubuntu"), "/home/ubuntu/.ssh/authorized_keys");
    }
}
