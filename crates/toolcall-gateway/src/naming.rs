//! The names clients see for the tools of many upstreams, without collisions.
//!
//! A tool `name` of the upstream `upstream` is listed as `upstream__name`, with every
//! character outside `A-Z a-z 0-9 _ -` replaced by `_`: the names every MCP client and
//! model API accepts (the strictest, the model APIs' tool names, allow those characters
//! and at most 64 of them). A name longer than [`MAX_NAME_CHARS`] keeps its first 55
//! characters and ends with `_` and 8 hexadecimal digits of a hash of the whole name; so
//! does a name that would otherwise be listed twice (the second, in the upstreams' order).

/// The longest tool name listed.
pub(crate) const MAX_NAME_CHARS: usize = 64;

/// The characters kept from a long name, before its hash.
const KEPT_CHARS: usize = MAX_NAME_CHARS - 9;

/// The listed names of `tools`, each `(upstream, tool name)`, in their order.
pub(crate) fn listed_names<'a>(tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    let mut names = Vec::new();
    for (upstream, name) in tools {
        let full = format!("{upstream}__{name}");
        let plain: String = full
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut listed = if plain.len() <= MAX_NAME_CHARS {
            plain.clone()
        } else {
            hashed(&plain, &full, 0)
        };
        let mut salt = 0;
        while !taken.insert(listed.clone()) {
            salt += 1;
            listed = hashed(&plain, &full, salt);
        }
        names.push(listed);
    }
    names
}

/// The first characters of `plain` and a hash of `full` (with `salt`, for a clash).
fn hashed(plain: &str, full: &str, salt: u32) -> String {
    // FNV-1a, 32 bits: stable across builds and platforms, which names must be.
    let mut hash: u32 = 0x811c_9dc5;
    for byte in full.bytes().chain(salt.to_le_bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let kept: String = plain.chars().take(KEPT_CHARS).collect();
    format!("{kept}_{hash:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_by_their_upstream_and_plain() {
        let names = listed_names([("time", "get_current_time"), ("fs", "read.file/v2")]);
        assert_eq!(names, ["time__get_current_time", "fs__read_file_v2"]);
    }

    #[test]
    fn long_names_are_cut_with_a_hash_and_stay_distinct() {
        let long = "a".repeat(80);
        let longer = format!("{long}b");
        let names = listed_names([("u", long.as_str()), ("u", longer.as_str())]);
        for name in &names {
            assert_eq!(name.len(), MAX_NAME_CHARS, "{name}");
            assert!(name.starts_with("u__aaaa"));
        }
        assert_ne!(names[0], names[1]);
    }

    #[test]
    fn names_that_clash_once_made_plain_get_a_hash() {
        let names = listed_names([("a", "b.c"), ("a", "b/c"), ("a", "b_c")]);
        assert_eq!(names[0], "a__b_c");
        assert!(
            names[1].starts_with("a__b_c_") && names[1].len() == 15,
            "{}",
            names[1]
        );
        assert_ne!(names[1], names[2]);
        assert_eq!(
            names.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
    }
}
