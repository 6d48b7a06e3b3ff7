//! Canonical JSON of params, params digests and derived idempotency keys.
//!
//! [`canonical_json`] writes a value as RFC 8785 (the JSON Canonicalization Scheme) does:
//! object members sorted by the UTF-16 code units of their names, no whitespace, strings
//! escaped as `JSON.stringify` escapes them, and numbers in the shortest form that reads back
//! as the same IEEE double, so `1`, `1.0` and `1e0` are one number and `-0` is `0`.
//!
//! One departure from RFC 8785: an integer beyond ±2^53, which a double may not hold exactly,
//! is written as its exact decimal digits. RFC 8785 would write the double nearest to it, so
//! the snowflake ids `1234567890123456789` and `1234567890123456788` would share one canonical
//! form (`1234567890123456800`), one derived key and one loop signature. Integers within
//! ±2^53 and all other numbers are written as RFC 8785 writes them.
//!
//! Before writing, three normalizations run by default (each can be switched off in
//! [`CanonicalOptions`]):
//!
//! - object members whose value is `null` are removed (nulls inside arrays stay);
//! - string values are trimmed of leading and trailing white space;
//! - members named in the volatile list (`clientTs`, `retryCount`, `traceparent`) are removed
//!   at any depth.
//!
//! Nesting deeper than [`CanonicalOptions::max_depth`] (64) is a `VALIDATION_ERROR`, found
//! before the walk goes any deeper, so hostile input cannot overflow the stack.
//!
//! ```
//! use serde_json::json;
//! use tower_toolcall::canonical::{canonical_json, derive_key, params_digest, CanonicalOptions};
//!
//! let opts = CanonicalOptions::default();
//! let params = json!({"b": 1.0, "a": "  hi ", "clientTs": 1734372720000_u64, "gone": null});
//! let canonical = canonical_json(&params, &opts)?;
//! assert_eq!(canonical, r#"{"a":"hi","b":1}"#);
//!
//! let digest = params_digest(&canonical);
//! assert_eq!(digest.len(), 64);
//! let key = derive_key("agents.tools.web", "search", &canonical, "sess-42", "user-7");
//! assert_ne!(key, derive_key("agents.tools.web", "search", &canonical, "sess-43", "user-7"));
//!
//! // Integers beyond 2^53 keep every digit.
//! let snowflake = canonical_json(&json!({"id": 1234567890123456789_u64}), &opts)?;
//! assert_eq!(snowflake, r#"{"id":1234567890123456789}"#);
//! # Ok::<(), tower_toolcall::ToolError>(())
//! ```

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

use crate::contract::error::{ErrorCode, ToolError};

/// The deepest nesting [`CanonicalOptions::with_max_depth`] accepts; larger settings are lowered
/// to it, because the walk recurses once per level.
pub const MAX_SUPPORTED_DEPTH: usize = 1024;

/// The members removed by default wherever they appear.
pub const DEFAULT_VOLATILE_MEMBERS: [&str; 3] = ["clientTs", "retryCount", "traceparent"];

/// How params are normalized before they are written canonically.
///
/// ```
/// use tower_toolcall::canonical::CanonicalOptions;
///
/// let opts = CanonicalOptions::default()
///     .with_trim_strings(false)
///     .with_volatile_members(["clientTs", "nonce"])
///     .with_max_depth(32);
/// assert_eq!(opts.max_depth(), 32);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalOptions {
    drop_null_members: bool,
    trim_strings: bool,
    volatile: VolatileMembers,
    max_depth: usize,
}

impl Default for CanonicalOptions {
    fn default() -> Self {
        CanonicalOptions {
            drop_null_members: true,
            trim_strings: true,
            volatile: VolatileMembers::default(),
            max_depth: 64,
        }
    }
}

/// The member names removed at any depth, shared by every clone of the options.
#[derive(Clone, Debug)]
struct VolatileMembers(Arc<VolatileNames>);

#[derive(Debug, PartialEq, Eq)]
struct VolatileNames {
    names: Box<[Box<str>]>,
    /// Bit `n` is set when a name is `n` bytes long (names of 63 bytes or more set bit 63):
    /// most member names are ruled out by their length alone.
    lengths: u64,
}

impl VolatileMembers {
    fn new<I: IntoIterator<Item = Box<str>>>(names: I) -> Self {
        let names: Box<[Box<str>]> = names.into_iter().collect();
        let lengths = names
            .iter()
            .fold(0, |mask, name| mask | Self::length_bit(name));
        VolatileMembers(Arc::new(VolatileNames { names, lengths }))
    }

    fn length_bit(name: &str) -> u64 {
        1 << name.len().min(63)
    }

    fn contains(&self, name: &str) -> bool {
        self.0.lengths & Self::length_bit(name) != 0 && self.0.names.iter().any(|v| **v == *name)
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.names.iter().map(|s| &**s)
    }
}

impl Default for VolatileMembers {
    /// The default names, one allocation shared by every default: options compare equal by
    /// pointer, as the cache of canonical params compares them on every call.
    fn default() -> Self {
        static DEFAULT: OnceLock<VolatileMembers> = OnceLock::new();
        DEFAULT
            .get_or_init(|| {
                VolatileMembers::new(DEFAULT_VOLATILE_MEMBERS.iter().map(|s| Box::from(*s)))
            })
            .clone()
    }
}

impl PartialEq for VolatileMembers {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for VolatileMembers {}

impl CanonicalOptions {
    /// Whether object members whose value is `null` are removed (default `true`).
    pub fn with_drop_null_members(mut self, drop: bool) -> Self {
        self.drop_null_members = drop;
        self
    }

    /// Whether string values are trimmed of leading and trailing white space (default `true`).
    pub fn with_trim_strings(mut self, trim: bool) -> Self {
        self.trim_strings = trim;
        self
    }

    /// The member names removed at any depth (default `clientTs`, `retryCount`,
    /// `traceparent`).
    pub fn with_volatile_members<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.volatile = VolatileMembers::new(names.into_iter().map(|s| s.into().into_boxed_str()));
        self
    }

    /// The deepest nesting accepted (default 64; at most [`MAX_SUPPORTED_DEPTH`]). An
    /// object or array counts one level, so `{"a": {"b": 1}}` is two levels deep.
    pub fn with_max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth.min(MAX_SUPPORTED_DEPTH);
        self
    }

    /// Whether object members whose value is `null` are removed.
    pub fn drop_null_members(&self) -> bool {
        self.drop_null_members
    }

    /// Whether string values are trimmed.
    pub fn trim_strings(&self) -> bool {
        self.trim_strings
    }

    /// The configured depth limit.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// The configured volatile member names.
    pub fn volatile_members(&self) -> impl Iterator<Item = &str> {
        self.volatile.iter()
    }

    fn keeps(&self, name: &str, value: &Value) -> bool {
        let dropped_null = self.drop_null_members && value.is_null();
        !dropped_null && !self.volatile.contains(name)
    }

    fn normalize<'s>(&self, s: &'s str) -> &'s str {
        let untrimmed =
            |b: Option<&u8>| b.is_some_and(|b| b.is_ascii() && !b.is_ascii_whitespace());
        let bytes = s.as_bytes();
        if !self.trim_strings || (untrimmed(bytes.first()) && untrimmed(bytes.last())) {
            s
        } else {
            s.trim()
        }
    }
}

/// The canonical JSON of `value`; see the [module docs](self).
///
/// Nesting deeper than the limit is a `VALIDATION_ERROR` naming `payload.params`.
pub fn canonical_json(value: &Value, options: &CanonicalOptions) -> Result<String, ToolError> {
    let mut out = String::with_capacity(256);
    write_canonical(value, options, &mut out)?;
    Ok(out)
}

/// [`canonical_json`] as a shared string: written in a buffer the thread keeps, then copied
/// once into the one allocation that is shared.
pub(crate) fn canonical_json_shared(
    value: &Value,
    options: &CanonicalOptions,
) -> Result<Arc<str>, ToolError> {
    thread_local! {
        static BUFFER: RefCell<String> = const { RefCell::new(String::new()) };
    }
    BUFFER.with_borrow_mut(|out| {
        out.clear();
        write_canonical(value, options, out)?;
        let shared = Arc::from(out.as_str());
        // A buffer grown by one very large value is not kept.
        if out.capacity() > SHARED_BUFFER_KEPT_CAPACITY {
            *out = String::new();
        }
        Ok(shared)
    })
}

/// The largest buffer [`canonical_json_shared`] keeps between calls.
const SHARED_BUFFER_KEPT_CAPACITY: usize = 64 * 1024;

/// Appends the canonical JSON of `value` to `out`. On error `out` may hold a partial write.
pub fn write_canonical(
    value: &Value,
    options: &CanonicalOptions,
    out: &mut String,
) -> Result<(), ToolError> {
    Writer { out, options }
        .value(value, 0)
        .map_err(|TooDeep| too_deep(options))
}

/// Checks `value` against the depth limit and the size limit without writing it.
///
/// The size is that of the canonical JSON. A cheap upper bound is computed first, and the
/// exact size only when the bound is over `max_bytes`, so small params cost one walk with no
/// allocation. Errors: `VALIDATION_ERROR` for nesting, `PAYLOAD_TOO_LARGE` for size.
pub fn check_limits(
    value: &Value,
    options: &CanonicalOptions,
    max_bytes: usize,
) -> Result<(), ToolError> {
    // The bound counts every member, dropped or not, so it is an upper bound of the size;
    // when it is over the limit, or too deep (perhaps only inside members the canonical form
    // drops), the exact walk decides.
    if let Ok(bound) = size_bound(value, 0, options.max_depth) {
        if bound <= max_bytes {
            return Ok(());
        }
    }
    let exact = ExactSize { options }
        .value(value, 0)
        .map_err(|TooDeep| too_deep(options))?;
    if exact <= max_bytes {
        return Ok(());
    }
    Err(ToolError::rejected(
        ErrorCode::PayloadTooLarge,
        format!(
            "`payload.params` is {exact} bytes of canonical JSON, over the limit of {max_bytes}; \
             send less data or pass a reference to it"
        ),
    )
    .with_details(serde_json::json!({
        "field": "payload.params",
        "bytes": exact,
        "limit": max_bytes,
    })))
}

/// `hex(sha256(canonical))`: the digest stored with an idempotency record.
pub fn params_digest(canonical: &str) -> String {
    params_digest_hex(canonical).as_str().to_owned()
}

/// [`params_digest`], on the stack.
pub(crate) fn params_digest_hex(canonical: &str) -> HexDigest {
    HexDigest::of(&Sha256::digest(canonical.as_bytes()).into())
}

/// The derived idempotency key:
/// `hex(sha256(namespace + "::" + name + "::" + canonical + "::" + session + "::" + actor))`,
/// with `%` and `:` in the namespace, the name, the session and the actor percent-encoded
/// as `%25` and `%3A`.
///
/// Escaped, those four parts hold no `:`, so the only `::` outside the canonical params are
/// the separators, and two different tuples of parts never join to the same text: the
/// namespace `x::y` with the name `z` is another key than the namespace `x` with the name
/// `y::z`. Parts without `%` or `:` are written as they are, so their keys are the formula's.
///
/// ```
/// use tower_toolcall::canonical::derive_key;
///
/// let params = r#"{"q":1}"#;
/// assert_ne!(
///     derive_key("x::y", "z", params, "sess-42", "user-7"),
///     derive_key("x", "y::z", params, "sess-42", "user-7"),
/// );
/// ```
pub fn derive_key(
    namespace: &str,
    name: &str,
    canonical: &str,
    session_key: &str,
    actor_id: &str,
) -> String {
    derived_key_hex(namespace, name, canonical, session_key, actor_id)
        .as_str()
        .to_owned()
}

/// [`derive_key`], on the stack.
pub(crate) fn derived_key_hex(
    namespace: &str,
    name: &str,
    canonical: &str,
    session_key: &str,
    actor_id: &str,
) -> HexDigest {
    // The params need no escape: they are what lies between the second separator and the
    // second-to-last one.
    let escaped = |part| escape_part(part, &DERIVED_KEY_ESCAPES);
    let parts = [
        escaped(namespace),
        escaped(name),
        Cow::Borrowed(canonical),
        escaped(session_key),
        escaped(actor_id),
    ];
    let mut hasher = Sha256::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update(b"::");
        }
        hasher.update(part.as_bytes());
    }
    HexDigest::of(&hasher.finalize().into())
}

/// The ASCII separators that a part of a key escapes, with `%` (see [`escape_part`]).
pub(crate) struct Escapes([bool; 128]);

impl Escapes {
    /// `%` and each of `separators`, which must be ASCII.
    pub(crate) const fn new(separators: &[u8]) -> Escapes {
        let mut escaped = [false; 128];
        escaped[b'%' as usize] = true;
        let mut i = 0;
        while i < separators.len() {
            escaped[separators[i] as usize] = true;
            i += 1;
        }
        Escapes(escaped)
    }

    fn contains(&self, b: u8) -> bool {
        self.0.get(usize::from(b)).copied().unwrap_or(false)
    }
}

/// The separators of a derived key's parts.
const DERIVED_KEY_ESCAPES: Escapes = Escapes::new(b":");

/// `part` with each byte of `escapes` percent-encoded (`%` as `%25`, `:` as `%3A`, `/` as
/// `%2F`, …): the result holds none of the separators, and different parts stay different. A
/// part with none of them is returned as it is.
///
/// Derived keys escape `:`; store keys escape `/`, `{` and `}` in every part, and `:` as well
/// in the tool's namespace and name.
pub(crate) fn escape_part<'a>(part: &'a str, escapes: &Escapes) -> Cow<'a, str> {
    if !part.bytes().any(|b| escapes.contains(b)) {
        return Cow::Borrowed(part);
    }
    let mut out = String::with_capacity(part.len() + 8);
    for c in part.chars() {
        match u8::try_from(c) {
            Ok(b) if escapes.contains(b) => {
                write!(out, "%{b:02X}").expect("a String takes any text");
            }
            _ => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The lowercase hex of a SHA-256 digest, held on the stack, so that the one string made of
/// it is the shared one.
pub(crate) struct HexDigest([u8; 64]);

impl HexDigest {
    fn of(digest: &[u8; 32]) -> HexDigest {
        let mut out = [0; 64];
        hex::encode_to_slice(digest, &mut out).expect("64 digits hold 32 bytes");
        HexDigest(out)
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// Compares two strings by their UTF-16 code units, as RFC 8785 sorts member names.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    // UTF-8 byte order is code point order, which differs from UTF-16 order only when a
    // supplementary character (4 UTF-8 bytes, a surrogate pair in UTF-16) meets a character
    // in U+E000..=U+FFFF. Without 4-byte sequences, bytes decide.
    let supplementary = |s: &str| s.bytes().any(starts_supplementary);
    if !supplementary(a) && !supplementary(b) {
        return a.as_bytes().cmp(b.as_bytes());
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

fn too_deep(options: &CanonicalOptions) -> ToolError {
    ToolError::rejected(
        ErrorCode::ValidationError,
        format!(
            "invalid tool call: `payload.params` nests deeper than {} levels; flatten the params",
            options.max_depth
        ),
    )
    .with_details(serde_json::json!({
        "field": "payload.params",
        "maxDepth": options.max_depth,
    }))
}

struct TooDeep;

fn enter(depth: usize, options: &CanonicalOptions) -> Result<usize, TooDeep> {
    if depth >= options.max_depth {
        Err(TooDeep)
    } else {
        Ok(depth + 1)
    }
}

struct Writer<'a> {
    out: &'a mut String,
    options: &'a CanonicalOptions,
}

impl Writer<'_> {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), TooDeep> {
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(true) => self.out.push_str("true"),
            Value::Bool(false) => self.out.push_str("false"),
            Value::Number(n) => write_number(self.out, n),
            Value::String(s) => write_escaped(self.out, self.options.normalize(s)),
            Value::Array(items) => {
                let depth = enter(depth, self.options)?;
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.value(item, depth)?;
                }
                self.out.push(']');
            }
            Value::Object(map) => {
                let depth = enter(depth, self.options)?;
                let kept = map
                    .iter()
                    .filter(|(name, value)| self.options.keeps(name, value))
                    .map(|(name, value)| (name.as_str(), value));
                // Members are written in the map's order, which is the canonical one unless
                // serde_json's `preserve_order` is on somewhere in the build or a name holds
                // a supplementary character; then the object is written again, sorted.
                let start = self.out.len();
                self.out.push('{');
                if !self.members_in_order(kept.clone(), depth)? {
                    self.out.truncate(start);
                    self.out.push('{');
                    let mut members: Vec<(&str, &Value)> = kept.collect();
                    members.sort_by(|a, b| cmp_utf16(a.0, b.0));
                    self.members(members.into_iter(), depth)?;
                }
                self.out.push('}');
            }
        }
        Ok(())
    }

    /// Writes members while they come in canonical order; `false` as soon as one does not.
    fn members_in_order<'v>(
        &mut self,
        members: impl Iterator<Item = (&'v str, &'v Value)>,
        depth: usize,
    ) -> Result<bool, TooDeep> {
        // Maps that keep their names sorted by bytes need no comparison of neighbours.
        let check_order = !maps_iterate_sorted();
        let mut previous: Option<&str> = None;
        for (name, member) in members {
            if check_order && previous.is_some_and(|p| p.as_bytes() >= name.as_bytes()) {
                return Ok(false);
            }
            if previous.is_some() {
                self.out.push(',');
            }
            // Bytes order names as UTF-16 does while no name holds a supplementary character.
            if !write_name(self.out, name) {
                return Ok(false);
            }
            self.value(member, depth)?;
            previous = Some(name);
        }
        Ok(true)
    }

    fn members<'v>(
        &mut self,
        members: impl Iterator<Item = (&'v str, &'v Value)>,
        depth: usize,
    ) -> Result<(), TooDeep> {
        for (i, (name, member)) in members.enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_escaped(self.out, name);
            self.out.push(':');
            self.value(member, depth)?;
        }
        Ok(())
    }
}

/// Writes a number: an integer that serde_json holds as a `u64` or `i64` as its decimal
/// digits, any other number as ECMAScript writes a double (RFC 8785).
fn write_number(out: &mut String, n: &Number) {
    with_number_text(n, |text| out.push_str(text));
}

/// Calls `f` with the canonical text of `n`.
///
/// Within ±2^53 an integer is an exact double whose shortest form is its decimal digits, as
/// RFC 8785 writes it. Beyond, a double may not hold it (1234567890123456789 and
/// 1234567890123456788 are the same double) and RFC 8785 would write the rounded value; its
/// exact digits keep different integers apart. That is the one departure from RFC 8785.
fn with_number_text<R>(n: &Number, f: impl FnOnce(&str) -> R) -> R {
    if let Some(v) = n.as_u64() {
        f(itoa::Buffer::new().format(v))
    } else if let Some(v) = n.as_i64() {
        f(itoa::Buffer::new().format(v))
    } else {
        f(ryu_js::Buffer::new().format(n.as_f64().unwrap_or(0.0)))
    }
}

/// How JSON.stringify writes each byte: 0 as it is, `u` as `\u00XX`, anything else as a
/// backslash and that letter.
const ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// `true` for a byte `JSON.stringify` escapes: a control character, a quote, a backslash.
fn needs_escape(byte: u8) -> bool {
    (byte < 0x20) | (byte == b'"') | (byte == b'\\')
}

/// `true` for the first byte of a 4-byte UTF-8 sequence: a supplementary character, a
/// surrogate pair in UTF-16.
fn starts_supplementary(byte: u8) -> bool {
    byte >= 0xF0
}

fn write_escaped(out: &mut String, s: &str) {
    out.push('"');
    // Most strings need no escape: one pass that the compiler vectorizes (no early exit)
    // finds that out, and the string is copied whole.
    let any_escape = s.bytes().fold(false, |any, byte| any | needs_escape(byte));
    if !any_escape {
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut start = 0;
    for (i, &byte) in s.as_bytes().iter().enumerate() {
        let escape = ESCAPES[usize::from(byte)];
        if escape == 0 {
            continue;
        }
        out.push_str(&s[start..i]);
        out.push('\\');
        if escape == b'u' {
            write!(out, "u{byte:04x}").expect("a String takes any text");
        } else {
            out.push(char::from(escape));
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Writes a member's name and its colon, unless the name holds a supplementary character (a
/// 4-byte UTF-8 sequence, which UTF-16 order puts elsewhere than byte order): then `false`,
/// having written nothing.
fn write_name(out: &mut String, name: &str) -> bool {
    // One pass over the bytes finds both what needs escaping and what is supplementary.
    let (escape, supplementary) = name.bytes().fold((false, false), |(escape, supp), byte| {
        (
            escape | needs_escape(byte),
            supp | starts_supplementary(byte),
        )
    });
    if supplementary {
        return false;
    }
    if escape {
        write_escaped(out, name);
    } else {
        out.push('"');
        out.push_str(name);
        out.push('"');
    }
    out.push(':');
    true
}

/// `true` when serde_json's maps iterate in the byte order of their names, as they do unless
/// its `preserve_order` feature is on in the build. Found once, by asking a map.
fn maps_iterate_sorted() -> bool {
    static SORTED: OnceLock<bool> = OnceLock::new();
    *SORTED.get_or_init(|| {
        let mut map = serde_json::Map::new();
        map.insert("b".to_owned(), Value::Null);
        map.insert("a".to_owned(), Value::Null);
        map.keys().map(String::as_str).eq(["a", "b"])
    })
}

fn escaped_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|byte| match ESCAPES[usize::from(byte)] {
            0 => 1,
            b'u' => 6,
            _ => 2,
        })
        .sum::<usize>()
}

/// An upper bound of the canonical size of `value` with every member kept.
fn size_bound(value: &Value, depth: usize, max_depth: usize) -> Result<usize, TooDeep> {
    Ok(match value {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        // The longest number ECMAScript writes: 17 significant digits after "-0.00000"
        // (between 1e-6 and 1e-5 it does not switch to exponent notation).
        Value::Number(_) => 25,
        // Every byte escapes to at most six.
        Value::String(s) => 2 + 6 * s.len(),
        Value::Array(items) => {
            if depth >= max_depth {
                return Err(TooDeep);
            }
            let mut size = 1 + items.len().max(1);
            for item in items {
                size += size_bound(item, depth + 1, max_depth)?;
            }
            size
        }
        Value::Object(map) => {
            if depth >= max_depth {
                return Err(TooDeep);
            }
            let mut size = 1 + map.len().max(1);
            for (name, member) in map {
                size += 3 + 6 * name.len() + size_bound(member, depth + 1, max_depth)?;
            }
            size
        }
    })
}

/// The exact size of the canonical JSON of a value, without writing it.
struct ExactSize<'a> {
    options: &'a CanonicalOptions,
}

impl ExactSize<'_> {
    fn value(&self, value: &Value, depth: usize) -> Result<usize, TooDeep> {
        Ok(match value {
            Value::Null | Value::Bool(true) => 4,
            Value::Bool(false) => 5,
            Value::Number(n) => with_number_text(n, str::len),
            Value::String(s) => escaped_len(self.options.normalize(s)),
            Value::Array(items) => {
                let depth = enter(depth, self.options)?;
                let mut size = 2 + items.len().saturating_sub(1);
                for item in items {
                    size += self.value(item, depth)?;
                }
                size
            }
            Value::Object(map) => {
                let depth = enter(depth, self.options)?;
                let mut size = 2;
                let mut kept: usize = 0;
                for (name, member) in map {
                    if self.options.keeps(name, member) {
                        kept += 1;
                        size += escaped_len(name) + 1 + self.value(member, depth)?;
                    }
                }
                size + kept.saturating_sub(1)
            }
        })
    }
}

/// A short hash that names a store key in results and logs without revealing it: the first
/// 16 hex digits of its SHA-256.
///
/// ```
/// use tower_toolcall::canonical::key_fingerprint;
///
/// let fp = key_fingerprint("acme/vault::createFile/s/sess-42/user-7/create-foo-1");
/// assert_eq!(fp.len(), 16);
/// assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
/// ```
pub fn key_fingerprint(store_key: &str) -> String {
    let digest = Sha256::digest(store_key.as_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Reverses [`escape_part`].
    fn unescape(escaped: &str) -> String {
        let mut bytes = Vec::new();
        let mut rest = escaped.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                let hex = std::str::from_utf8(&tail[..2]).unwrap();
                bytes.push(u8::from_str_radix(hex, 16).unwrap());
                rest = &tail[2..];
            } else {
                bytes.push(b);
                rest = tail;
            }
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn escaped_parts_are_percent_encoded_and_others_untouched() {
        assert_eq!(escape_part("a%:/é", &Escapes::new(b":/")), "a%25%3A%2Fé");
        assert_eq!(escape_part("a:b", &Escapes::new(b"/")), "a:b");
        assert!(matches!(
            escape_part("sess-42", &Escapes::new(b":/")),
            Cow::Borrowed("sess-42")
        ));
    }

    proptest! {
        #[test]
        fn escaping_holds_no_separator_and_can_be_undone(part in "[x:/%{}é3A]{0,8}") {
            for separators in [&b":"[..], b"/{}", b"/{}:"] {
                let escaped = escape_part(&part, &Escapes::new(separators));
                prop_assert!(!escaped.bytes().any(|b| separators.contains(&b)), "{}", escaped);
                prop_assert_eq!(unescape(&escaped), part.clone());
            }
        }
    }
}
