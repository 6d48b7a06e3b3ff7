//! The approximate size in memory of JSON values that the crate keeps.

use serde_json::Value;

/// The approximate heap size of `value`: each value's own size, and the bytes of its strings
/// and member names. It walks the value without recursion, whatever its depth.
pub(crate) fn json_bytes(value: &Value) -> usize {
    let mut bytes = 0;
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        bytes += std::mem::size_of::<Value>();
        match value {
            Value::String(s) => bytes += s.len(),
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => {
                for (name, member) in map {
                    bytes += std::mem::size_of::<String>() + name.len();
                    pending.push(member);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_sizes_count_strings_and_names_at_any_depth() {
        use serde_json::{json, Value};
        let value_size = std::mem::size_of::<Value>();
        assert_eq!(super::json_bytes(&json!(null)), value_size);
        assert_eq!(super::json_bytes(&json!("abcd")), value_size + 4);
        let object = json!({"ab": ["xyz", 1]});
        assert_eq!(
            super::json_bytes(&object),
            4 * value_size + std::mem::size_of::<String>() + 2 + 3
        );
        let mut deep = json!(1);
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert_eq!(super::json_bytes(&deep), 100_001 * value_size);
        // Taken apart from the leaf up, without a recursive drop.
        let mut parts = Vec::new();
        while let Value::Array(mut items) = deep {
            deep = items.pop().unwrap();
            parts.push(items);
        }
    }
}
