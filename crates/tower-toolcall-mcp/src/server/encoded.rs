//! A `tools/list` result encoded once per list and per set of tools a caller sees, and
//! shared by every answer that sends it: an answer a client does not read holds a count of
//! the bytes, not a copy of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use rmcp::model::{ListToolsResult, Tool};

/// The most visible sets kept encoded for one list: a caller whose set is not among them
/// has its list encoded anew (and kept, in place of the others).
const MAX_SETS: usize = 32;

/// The encodings of one list, by which of its tools they show.
#[derive(Debug, Default)]
pub(crate) struct Encodings {
    current: Mutex<Option<Encoded>>,
}

#[derive(Debug)]
struct Encoded {
    /// The list they encode: another list starts the encodings again.
    tools: Arc<[Tool]>,
    /// Each visible set (a bit per tool of `tools`) and its encoding.
    by_set: HashMap<Vec<u64>, Bytes>,
}

impl Encodings {
    /// The `tools/list` result of the tools of `tools` that `shows` keeps, as JSON.
    pub(crate) fn of(&self, tools: &Arc<[Tool]>, shows: impl Fn(&Tool) -> bool) -> Bytes {
        let mut set = vec![0u64; tools.len().div_ceil(64)];
        for (index, tool) in tools.iter().enumerate() {
            if shows(tool) {
                set[index / 64] |= 1 << (index % 64);
            }
        }
        {
            let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(encoded) = current
                .as_ref()
                .filter(|encoded| Arc::ptr_eq(&encoded.tools, tools))
            {
                if let Some(bytes) = encoded.by_set.get(&set) {
                    return bytes.clone();
                }
            }
        }
        // Encoded outside the lock: a large list takes a while.
        let shown: Vec<Tool> = tools
            .iter()
            .enumerate()
            .filter(|(index, _)| set[index / 64] & (1 << (index % 64)) != 0)
            .map(|(_, tool)| tool.clone())
            .collect();
        let bytes = Bytes::from(
            serde_json::to_vec(&ListToolsResult::with_all_items(shown))
                .expect("a tool list encodes as JSON"),
        );
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let encoded = match current.as_mut() {
            Some(encoded) if Arc::ptr_eq(&encoded.tools, tools) => encoded,
            _ => current.insert(Encoded {
                tools: tools.clone(),
                by_set: HashMap::new(),
            }),
        };
        if encoded.by_set.len() >= MAX_SETS {
            encoded.by_set.clear();
        }
        encoded.by_set.insert(set, bytes.clone());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &'static str) -> Tool {
        Tool::new(name, "a tool", Arc::new(serde_json::Map::new()))
    }

    #[test]
    fn one_encoding_per_list_and_visible_set_is_shared() {
        let encodings = Encodings::default();
        let tools: Arc<[Tool]> = vec![tool("a"), tool("b")].into();
        let all = encodings.of(&tools, |_| true);
        let again = encodings.of(&tools, |_| true);
        // The same bytes, not a copy.
        assert_eq!(all.as_ptr(), again.as_ptr());
        let only_a = encodings.of(&tools, |tool| tool.name == "a");
        let value: serde_json::Value = serde_json::from_slice(&only_a).unwrap();
        assert_eq!(value["tools"].as_array().unwrap().len(), 1);
        assert_eq!(value["tools"][0]["name"], "a");
        // As rmcp encodes the result itself.
        assert_eq!(
            &all[..],
            serde_json::to_vec(&ListToolsResult::with_all_items(tools.to_vec())).unwrap()
        );
        // Another list: encoded anew.
        let other: Arc<[Tool]> = vec![tool("a"), tool("b")].into();
        assert_ne!(encodings.of(&other, |_| true).as_ptr(), all.as_ptr());
    }
}
