//! Which object keys may become paths under a mount, and the listing clean-up that drops
//! the rest.
//!
//! A key is shown only if it is a plain relative path: no leading `/`, no empty component
//! (`a//b` is skipped, not collapsed to `a/b`, because collapsing could shadow a real `a/b`
//! and the listed key would no longer be the key we read), no `.` or `..` component, no NUL
//! or other control character, no component longer than a file name may be (255 bytes).
//! A key that is also a directory (`a` beside `a/b`) is skipped too: the directory wins.

use std::collections::HashSet;

use super::ObjectInfo;

/// Longest file name Linux accepts (NAME_MAX).
const NAME_MAX: usize = 255;

/// Why a key cannot be shown as a path.
pub fn unsafe_reason(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        return Some("empty key");
    }
    if key.starts_with('/') {
        return Some("leading '/'");
    }
    if key.chars().any(|c| c.is_control()) {
        return Some("NUL or control character");
    }
    for part in key.split('/') {
        match part {
            "" => return Some("empty path component ('//' or trailing '/')"),
            "." | ".." => return Some("'.' or '..' path component"),
            p if p.len() > NAME_MAX => return Some("path component longer than 255 bytes"),
            _ => {}
        }
    }
    None
}

/// Drops unsafe keys and keys shadowed by a directory, warning once per key, and sorts the
/// rest by key.
pub fn clean_listing(source_id: &str, mut objects: Vec<ObjectInfo>) -> Vec<ObjectInfo> {
    // Empty `dir/` objects are directory markers (S3 consoles make them): not files, and
    // too common to warn about.
    objects.retain(|o| {
        !(o.size == 0
            && o.key.ends_with('/')
            && unsafe_reason(o.key.trim_end_matches('/')).is_none())
    });
    objects.retain(|o| match unsafe_reason(&o.key) {
        None => true,
        Some(reason) => {
            tracing::warn!(source = source_id, key = %o.key.escape_debug(), reason, "skipping object: its key is not a safe path");
            false
        }
    });
    let mut dirs = HashSet::new();
    for o in &objects {
        let mut end = 0;
        while let Some(i) = o.key[end..].find('/') {
            end += i;
            dirs.insert(&o.key[..end]);
            end += 1;
        }
    }
    let dirs: HashSet<String> = dirs.into_iter().map(str::to_owned).collect();
    objects.retain(|o| {
        if dirs.contains(&o.key) {
            tracing::warn!(source = source_id, key = %o.key.escape_debug(), "skipping object: a directory of the same name exists");
            false
        } else {
            true
        }
    });
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    objects.dedup_by(|a, b| a.key == b.key);
    objects
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size: 1,
            version: None,
            modified: 0,
        }
    }

    #[test]
    fn hostile_keys_are_dropped() {
        for k in [
            "a/../b",
            "a//b",
            "./x",
            "/etc/passwd",
            "x\0y",
            "a/",
            "..",
            "",
        ] {
            assert!(unsafe_reason(k).is_some(), "{k:?}");
        }
        for k in ["a/b", "a..b/c", ".hidden", "x y/z"] {
            assert!(unsafe_reason(k).is_none(), "{k:?}");
        }
        let mut marker = obj("c/");
        marker.size = 0;
        let kept = clean_listing(
            "t",
            vec![
                obj("b"),
                obj("a"),
                obj("a/x"),
                obj("a/../b"),
                obj("c/d/e"),
                obj("c/d"),
                marker,
            ],
        );
        let keys: Vec<_> = kept.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a/x", "b", "c/d/e"]);
    }
}
