//! How a record is kept in Redis, and the scripts that change it.
//!
//! A record is one string: a header line `<state> <version>` (at most 31 bytes; the scripts
//! read its first 41 bytes, never the whole record), then the record's JSON. A claim is a
//! plain `SET … NX PX … GET`, so that a duplicate costs the server no more than a `GET`; every
//! step that must compare versions is a script.

use tower_toolcall::idempotency::StoreError;
use tower_toolcall::idempotency::{DedupeRecord, RecordState};

/// How a record's completion is published: `PUBLISH` on a node; on a cluster, `SPUBLISH`
/// (Redis 7), which stays on the shard of the channel's slot, the record's own.
pub(super) fn publish_command(cluster: bool) -> &'static str {
    if cluster {
        "SPUBLISH"
    } else {
        "PUBLISH"
    }
}

/// KEYS: record, channel. ARGV: version, new value, TTL in ms, publish (1/0).
///
/// Replaces the in-flight record of that version (finalize, cancel, renew) and, when asked,
/// publishes the new value with `publish` (see [`publish_command`]). The same replacement
/// sent again (the client sent it once more after a lost connection) finds its own value and
/// answers as the first did. Returns `{1}`, or `{0, version that holds the key}`.
pub(super) fn replace(publish: &str) -> String {
    format!(
        "\
local head = redis.call('GETRANGE', KEYS[1], 0, 40)
local state, version = string.match(head, '^(%a+) (%d+)\\n')
if state ~= 'inflight' or version ~= ARGV[1] then
  if version == ARGV[1] and redis.call('GET', KEYS[1]) == ARGV[2] then
    return {{1}}
  end
  return {{0, version}}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] == '1' then
  redis.call('{publish}', KEYS[2], ARGV[2])
end
return {{1}}
"
    )
}

/// KEYS: record. ARGV: version seen, new value, lease in ms.
///
/// Claims a key whose record (cancelled, or a retriable failure) still has the version seen,
/// or that has no record any more. Returns `{1}`, or `{0, value that holds the key}`.
pub(super) const TAKE_OVER: &str = "\
local head = redis.call('GETRANGE', KEYS[1], 0, 40)
if head ~= '' and string.match(head, '^%a+ (%d+)\\n') ~= ARGV[1] then
  return {0, redis.call('GET', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1}
";

/// KEYS: record, channel. ARGV: version, message.
///
/// Deletes the in-flight record of that version (a claim whose answer nobody read) and
/// publishes the message with `publish`, so that its waiters claim the key. Returns 1 when
/// it did, else 0.
pub(super) fn release(publish: &str) -> String {
    format!(
        "\
local head = redis.call('GETRANGE', KEYS[1], 0, 40)
if string.match(head, '^inflight (%d+)\\n') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('{publish}', KEYS[2], ARGV[2])
return 1
"
    )
}

/// KEYS: record. Returns `{value or nil, PTTL}`.
pub(super) const READ: &str = "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}\n";

/// The stored form of `record`.
pub(super) fn encode(record: &DedupeRecord) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(record.state.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(record.version.to_string().as_bytes());
    out.push(b'\n');
    serde_json::to_writer(&mut out, record)
        .map_err(|e| StoreError::Corrupt(format!("a record that does not serialize: {e}")))?;
    Ok(out)
}

/// The record of a stored value.
pub(super) fn decode(value: &[u8]) -> Result<DedupeRecord, StoreError> {
    let corrupt = |problem: String| StoreError::Corrupt(format!("a stored record {problem}"));
    let newline = value
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("has no header".to_owned()))?;
    let header = std::str::from_utf8(&value[..newline])
        .map_err(|_| corrupt("has a header that is not UTF-8".to_owned()))?;
    let (state, version) = header
        .split_once(' ')
        .and_then(|(s, v)| Some((RecordState::parse(s)?, v.parse::<u64>().ok()?)))
        .ok_or_else(|| corrupt(format!("has the header {header:?}")))?;
    let record: DedupeRecord = serde_json::from_slice(&value[newline + 1..])
        .map_err(|e| corrupt(format!("does not parse: {e}")))?;
    if record.state != state || record.version != version {
        return Err(corrupt(format!(
            "says `{header}` in its header and `{} {}` in its body",
            record.state.as_str(),
            record.version
        )));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tower_toolcall::idempotency::ClaimRequest;
    use tower_toolcall::ToolCall;

    #[test]
    fn a_record_round_trips_and_its_header_is_checked() {
        let request = ClaimRequest::new(
            "/vault::createFile/g/k",
            "k",
            "d",
            ToolCall::builder("vault", "createFile")
                .session("s")
                .actor("a")
                .build()
                .unwrap(),
            Duration::from_secs(120),
        );
        let record = request.inflight_record(1_734_372_720_000_123, 1_734_372_720_000);
        let value = encode(&record).unwrap();
        assert!(value.starts_with(b"inflight 1734372720000123\n{"));
        assert_eq!(decode(&value).unwrap(), record);

        let forged = [b"done 1\n".as_slice(), &value[26..]].concat();
        assert!(matches!(decode(&forged), Err(StoreError::Corrupt(_))));
        assert!(matches!(decode(b"no header"), Err(StoreError::Corrupt(_))));
    }
}
