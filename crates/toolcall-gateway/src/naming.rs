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

/// The most names a [`NameBook`] keeps: past them, a new tool's name is unique in its list
/// but no longer reserved for the gateway's life.
const MAX_KEPT_NAMES: usize = 100_000;

/// The listed names given so far. Once given, a name means the same upstream tool for the
/// gateway's life: a tool keeps its name across list changes and reloads, and a name whose
/// tool left is never given to another (which would turn a call meant for one tool, a model
/// holding the old list, into a call of the other).
#[derive(Debug, Default)]
pub(crate) struct NameBook {
    by_tool: std::collections::HashMap<(String, String), String>,
    taken: std::collections::HashSet<String>,
}

impl NameBook {
    /// The listed names of `tools`, each `(upstream, tool name)`, in their order: the name a
    /// tool was given before, else a new one no tool ever had.
    pub(crate) fn names<'a>(
        &mut self,
        tools: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vec<String> {
        let mut this_list = std::collections::HashSet::new();
        let mut names = Vec::new();
        for (upstream, name) in tools {
            let key = (upstream.to_owned(), name.to_owned());
            if let Some(given) = self.by_tool.get(&key) {
                if this_list.insert(given.clone()) {
                    names.push(given.clone());
                    continue;
                }
            }
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
            while self.taken.contains(&listed) || !this_list.insert(listed.clone()) {
                salt += 1;
                listed = hashed(&plain, &full, salt);
            }
            if self.taken.len() < MAX_KEPT_NAMES {
                self.taken.insert(listed.clone());
                self.by_tool.insert(key, listed.clone());
            }
            names.push(listed);
        }
        names
    }
}

/// The listed names of `tools`, each `(upstream, tool name)`, in their order, given by a new
/// book.
#[cfg(test)]
pub(crate) fn listed_names<'a>(tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    NameBook::default().names(tools)
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
    fn a_name_once_given_never_moves_to_another_tool() {
        let mut book = NameBook::default();
        // Two tools whose plain names are one: the second gets a hash.
        let first = book.names([("up", "b.read"), ("fs", "write")]);
        assert_eq!(first, ["up__b_read", "fs__write"]);
        // The first leaves; the one that would now take its plain name does not get it.
        let second = book.names([("up", "b/read"), ("fs", "write")]);
        assert_ne!(second[0], "up__b_read");
        assert!(second[0].starts_with("up__b_read_"), "{}", second[0]);
        assert_eq!(second[1], "fs__write");
        // The first comes back under its own name.
        let third = book.names([("up", "b/read"), ("up", "b.read"), ("fs", "write")]);
        assert_eq!(
            third,
            [second[0].clone(), first[0].clone(), first[1].clone()]
        );
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
