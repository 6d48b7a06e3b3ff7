//! References in a step's args, resolved before dispatch: pure functions of the args and
//! what the run knows.
//!
//! - A string that is a whole reference becomes the value it points at, of any type:
//!   `"$steps.search.hits.0"`, `"$vars.city"`, `"{item.path}"`, `"{index}"`.
//! - A reference in braces inside a longer string is written into it (strings as they are,
//!   other values as JSON): `"Hotels in {$steps.flights.city} for {item.name}"`.
//! - A path goes down objects by member name and arrays by index: `a.b.0` or `a.b[0]`.
//! - Braces around anything else are kept as they are.
//!
//! What resolution builds is bounded as it is built: the args may not pass the params limit
//! ([`DEFAULT_MAX_PARAMS_BYTES`](tower_toolcall::validate::DEFAULT_MAX_PARAMS_BYTES) by default) nor
//! nest deeper than the envelope's depth limit (64 by default). A value a reference points at
//! is measured, within what is left of the limit, before it is copied, so that args that
//! would multiply an output (the same large output referenced many times, or an output that
//! doubles at every step) are refused before they take the memory.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Number, Value};

use tower_toolcall::canonical::CanonicalOptions;
use tower_toolcall::validate::DEFAULT_MAX_PARAMS_BYTES;
use tower_toolcall::ErrorCode;

/// What a run knows when it resolves a step's args: the outputs of the finished steps, the
/// variables, and in a `foreach`, the item and its index.
///
/// ```
/// use std::collections::HashMap;
/// use serde_json::{json, Map};
/// use tower_toolcall_executor::{resolve, Scope};
///
/// let mut steps = HashMap::new();
/// steps.insert("flights".to_owned(), json!({"arrival": "LYS", "city": "Lyon"}));
/// let vars = Map::new();
/// let item = json!({"name": "Hotel Bellecour"});
/// let scope = Scope::new(&steps, &vars).with_item("item", &item).with_index("index", 2);
///
/// let args = json!({
///     "airport": "$steps.flights.arrival",
///     "query": "{item.name} in {$steps.flights.city}",
///     "rank": "{index}",
/// });
/// assert_eq!(
///     resolve(&args, &scope)?,
///     json!({"airport": "LYS", "query": "Hotel Bellecour in Lyon", "rank": 2})
/// );
/// # Ok::<(), tower_toolcall_executor::ResolveError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    steps: &'a HashMap<String, Value>,
    vars: &'a Map<String, Value>,
    /// Variables read when `vars` does not have the name (the plan's own, under the ones
    /// the run captured).
    base_vars: Option<&'a Map<String, Value>>,
    item: Option<(&'a str, &'a Value)>,
    index: Option<(&'a str, u64)>,
    max_bytes: usize,
    max_depth: usize,
}

impl<'a> Scope<'a> {
    /// The outputs of the finished steps (by step id) and the variables, with the envelope's
    /// default limits: [`DEFAULT_MAX_PARAMS_BYTES`](tower_toolcall::validate::DEFAULT_MAX_PARAMS_BYTES)
    /// and 64 levels.
    pub fn new(steps: &'a HashMap<String, Value>, vars: &'a Map<String, Value>) -> Self {
        Scope {
            steps,
            vars,
            base_vars: None,
            item: None,
            index: None,
            max_bytes: DEFAULT_MAX_PARAMS_BYTES,
            max_depth: CanonicalOptions::default().max_depth(),
        }
    }

    /// The variables read when a name is not in the scope's own.
    pub(crate) fn with_base_vars(mut self, vars: &'a Map<String, Value>) -> Self {
        self.base_vars = Some(vars);
        self
    }

    /// The most bytes the resolved args may take as compact JSON. Resolution stops with an
    /// error as soon as what it builds would pass it, before the value is copied.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use serde_json::{json, Map};
    /// use tower_toolcall_executor::{resolve, Scope};
    ///
    /// let mut steps = HashMap::new();
    /// steps.insert("page".to_owned(), json!("x".repeat(600)));
    /// let vars = Map::new();
    /// let scope = Scope::new(&steps, &vars).with_max_bytes(1_000);
    /// assert!(resolve(&json!({"a": "$steps.page"}), &scope).is_ok());
    /// let err = resolve(&json!({"a": "$steps.page", "b": "$steps.page"}), &scope).unwrap_err();
    /// assert_eq!(err.field(), "args.b");
    /// assert!(err.problem().contains("limit of 1000 bytes"));
    /// ```
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The deepest nesting of the resolved args, in levels of arrays and objects.
    pub fn with_max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    fn var(&self, name: &str) -> Option<&'a Value> {
        self.vars
            .get(name)
            .or_else(|| self.base_vars.and_then(|vars| vars.get(name)))
    }

    /// Binds the `foreach` item to `name`.
    pub fn with_item(mut self, name: &'a str, item: &'a Value) -> Self {
        self.item = Some((name, item));
        self
    }

    /// Binds the `foreach` index to `name`.
    pub fn with_index(mut self, name: &'a str, index: u64) -> Self {
        self.index = Some((name, index));
        self
    }
}

/// A reference that cannot be resolved: where it is in the args, what it says, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolveError {
    field: String,
    reference: String,
    problem: String,
    failure: Failure,
}

/// What kind of problem a [`ResolveError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The reference points at nothing.
    Missing,
    /// The args would pass the size limit.
    TooLarge,
    /// The args would nest deeper than the depth limit.
    TooDeep,
}

impl ResolveError {
    /// The path of the member of the args that holds the reference, e.g. `args.query`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The reference as written (empty when the problem is the args themselves, such as
    /// nesting deeper than the limit).
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The code of the call's refusal: `PAYLOAD_TOO_LARGE` for args over the size limit,
    /// `VALIDATION_ERROR` otherwise.
    pub(crate) fn code(&self) -> ErrorCode {
        match self.failure {
            Failure::TooLarge => ErrorCode::PayloadTooLarge,
            Failure::Missing | Failure::TooDeep => ErrorCode::ValidationError,
        }
    }

    /// Why it cannot be resolved.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reference.is_empty() {
            write!(f, "`{}` {}", self.field, self.problem)
        } else {
            write!(
                f,
                "`{}`: reference `{}` {}",
                self.field, self.reference, self.problem
            )
        }
    }
}

impl std::error::Error for ResolveError {}

/// Where a reference points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source<'t> {
    /// `$steps.<id>`.
    Step(&'t str),
    /// `$vars.<name>`.
    Var(&'t str),
    /// `{<name>…}`: a `foreach` binding (the item or the index), by name.
    Binding(&'t str),
}

/// One reference: its source and the path below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reference<'t> {
    pub(crate) source: Source<'t>,
    pub(crate) path: Vec<&'t str>,
    pub(crate) text: &'t str,
}

/// A string of the args: a whole reference, or text with references in it.
enum Parsed<'t> {
    Whole(Reference<'t>),
    Text(Vec<Piece<'t>>),
}

enum Piece<'t> {
    Literal(&'t str),
    Reference(Reference<'t>),
}

/// Reads a reference from `text` (`$steps.id.path`, `$vars.name.path`, or `name.path` for a
/// binding when `binding` is allowed), or `None` when it is not one.
fn reference(text: &str, binding: bool) -> Option<Reference<'_>> {
    let (source, rest) = if let Some(rest) = text.strip_prefix("$steps.") {
        let (id, rest) = split_head(rest);
        (Source::Step(id), rest)
    } else if let Some(rest) = text.strip_prefix("$vars.") {
        let (name, rest) = split_head(rest);
        (Source::Var(name), rest)
    } else if binding {
        let (name, rest) = split_head(text);
        if !is_name(name) {
            return None;
        }
        (Source::Binding(name), rest)
    } else {
        return None;
    };
    let path = path(rest)?;
    match source {
        Source::Step(s) | Source::Var(s) if !is_name(s) => None,
        _ => Some(Reference { source, path, text }),
    }
}

fn split_head(text: &str) -> (&str, &str) {
    let end = text.find(['.', '[']).unwrap_or(text.len());
    text.split_at(end)
}

/// `true` when `name` can follow `$steps.` or `$vars.` in a reference: letters, digits, `_`
/// and `-`.
pub(crate) fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}

/// The segments of `.a.b[0].c`; `None` when malformed.
fn path(mut rest: &str) -> Option<Vec<&str>> {
    let mut segments = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let (segment, tail) = after.split_at(end);
            if segment.is_empty() {
                return None;
            }
            segments.push(segment);
            rest = tail;
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            let index = &after[..end];
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            segments.push(index);
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(segments)
}

fn parse(text: &str) -> Parsed<'_> {
    if let Some(whole) = reference(text, false) {
        return Parsed::Whole(whole);
    }
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut literal_start = 0;
    let mut offset = 0;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(['{', '}']) else {
            break;
        };
        if after.as_bytes()[close] == b'{' {
            offset += open + 1 + close;
            rest = &after[close..];
            continue;
        }
        let inner = &after[..close];
        let consumed = open + 1 + close + 1;
        if let Some(found) = reference(inner, true) {
            let start = offset + open;
            if start > literal_start {
                pieces.push(Piece::Literal(&text[literal_start..start]));
            }
            pieces.push(Piece::Reference(found));
            literal_start = offset + consumed;
        }
        offset += consumed;
        rest = &rest[consumed..];
    }
    if pieces.len() == 1 && literal_start == text.len() {
        if let Some(Piece::Reference(only)) = pieces.pop() {
            return Parsed::Whole(only);
        }
    }
    if literal_start < text.len() && !pieces.is_empty() {
        pieces.push(Piece::Literal(&text[literal_start..]));
    }
    Parsed::Text(pieces)
}

/// Every reference in `args`, with the path of the member that holds it.
pub(crate) fn references(args: &Value) -> Vec<(String, Reference<'_>)> {
    let mut found = Vec::new();
    if is_static(args) {
        return found;
    }
    walk(
        args,
        &mut String::from("args"),
        &mut |field, text| match parse(text) {
            Parsed::Whole(r) => found.push((field.to_owned(), r)),
            Parsed::Text(pieces) => {
                for piece in pieces {
                    if let Piece::Reference(r) = piece {
                        found.push((field.to_owned(), r));
                    }
                }
            }
        },
    );
    found
}

/// Calls `visit` on every string of `value` with the path of its member. The walk recurses
/// once per level: `value` is one whose depth was checked ([`deeper_than`]).
fn walk<'v>(value: &'v Value, field: &mut String, visit: &mut impl FnMut(&str, &'v str)) {
    match value {
        Value::String(text) => visit(field, text),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = field.len();
                field.push_str(&format!("[{i}]"));
                walk(item, field, visit);
                field.truncate(len);
            }
        }
        Value::Object(members) => {
            for (name, member) in members {
                let len = field.len();
                field.push('.');
                field.push_str(name);
                walk(member, field, visit);
                field.truncate(len);
            }
        }
        _ => {}
    }
}

/// The members of a container, walked without recursion.
enum Children<'v> {
    Items(std::slice::Iter<'v, Value>),
    Members(serde_json::map::Values<'v>),
}

impl<'v> Children<'v> {
    /// The children of `value`, `None` for a scalar.
    fn of(value: &'v Value) -> Option<Self> {
        match value {
            Value::Array(items) => Some(Children::Items(items.iter())),
            Value::Object(members) => Some(Children::Members(members.values())),
            _ => None,
        }
    }
}

impl<'v> Iterator for Children<'v> {
    type Item = &'v Value;

    fn next(&mut self) -> Option<&'v Value> {
        match self {
            Children::Items(items) => items.next(),
            Children::Members(members) => members.next(),
        }
    }
}

/// Every value of a tree, depth first, each with the number of containers around it; no
/// recursion, and no more memory than one iterator per level.
struct Nodes<'v> {
    first: Option<&'v Value>,
    stack: Vec<Children<'v>>,
}

impl<'v> Nodes<'v> {
    fn new(root: &'v Value) -> Self {
        Nodes {
            first: Some(root),
            stack: Vec::new(),
        }
    }

    /// The next value and its depth; the children of a container come after it.
    fn next(&mut self) -> Option<(&'v Value, usize)> {
        let value = match self.first.take() {
            Some(value) => value,
            None => loop {
                let top = self.stack.last_mut()?;
                match top.next() {
                    Some(value) => break value,
                    None => {
                        self.stack.pop();
                    }
                }
            },
        };
        let depth = self.stack.len();
        if let Some(children) = Children::of(value) {
            self.stack.push(children);
        }
        Some((value, depth))
    }
}

/// `true` when `value` nests more than `max_depth` levels of arrays and objects (the
/// envelope's rule: a container at depth `max_depth` is one too many). No recursion, so any
/// depth is safe to check.
pub(crate) fn deeper_than(value: &Value, max_depth: usize) -> bool {
    let mut nodes = Nodes::new(value);
    while let Some((value, depth)) = nodes.next() {
        if depth >= max_depth && (value.is_array() || value.is_object()) {
            return true;
        }
    }
    false
}

/// `true` when no string in `value` could hold a reference (none has `$` or `{`): it
/// resolves to itself, and its args can be checked before the run.
pub(crate) fn is_static(value: &Value) -> bool {
    let mut nodes = Nodes::new(value);
    while let Some((value, _)) = nodes.next() {
        if let Value::String(text) = value {
            if text.contains(['$', '{']) {
                return false;
            }
        }
    }
    true
}

/// Why a value does not fit.
enum Over {
    Bytes,
    Depth,
}

/// The size of `value` as compact JSON, if it is at most `max_bytes` and its containers
/// nest at most `max_depth` levels; the walk stops as soon as either is passed, so it costs
/// at most `max_bytes` steps whatever the size of `value`.
fn json_size(value: &Value, max_bytes: usize, max_depth: usize) -> Result<usize, Over> {
    let mut size = 0usize;
    let mut nodes = Nodes::new(value);
    while let Some((value, depth)) = nodes.next() {
        let own = match value {
            Value::Null => 4,
            Value::Bool(true) => 4,
            Value::Bool(false) => 5,
            Value::Number(n) => number_len(n),
            Value::String(s) => string_len(s),
            Value::Array(items) => {
                if depth >= max_depth {
                    return Err(Over::Depth);
                }
                2 + items.len().saturating_sub(1)
            }
            Value::Object(members) => {
                if depth >= max_depth {
                    return Err(Over::Depth);
                }
                let mut own = 2 + members.len().saturating_sub(1);
                for name in members.keys() {
                    own = own.saturating_add(string_len(name) + 1);
                    if own > max_bytes {
                        return Err(Over::Bytes);
                    }
                }
                own
            }
        };
        size = size.saturating_add(own);
        if size > max_bytes {
            return Err(Over::Bytes);
        }
    }
    Ok(size)
}

/// The length of `n` as JSON.
fn number_len(n: &Number) -> usize {
    struct Count(usize);
    impl fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = fmt::write(&mut count, format_args!("{n}"));
    count.0
}

/// The length of `s` as a JSON string, quotes and escapes included.
fn string_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Resolves every reference in `args` against `scope`; the args are not changed.
///
/// A reference to a step that has not finished, a variable that is not set, a binding outside
/// a `foreach`, or a path that is not in the value, is an error naming the member. So are
/// args that would pass the scope's size limit ([`Scope::with_max_bytes`]) or depth limit
/// ([`Scope::with_max_depth`]): each value is measured before it is copied, so resolution
/// never holds more than the limit.
pub fn resolve(args: &Value, scope: &Scope<'_>) -> Result<Value, ResolveError> {
    let mut builder = Builder {
        scope,
        left: scope.max_bytes,
        field: String::from("args"),
    };
    if is_static(args) {
        builder.take(args, 0, "")?;
        return Ok(args.clone());
    }
    builder.value(args, 0)
}

/// Builds resolved args, counting what it has built against the limits.
struct Builder<'s, 'a> {
    scope: &'s Scope<'a>,
    /// Bytes of the size limit not used yet.
    left: usize,
    /// The member being built.
    field: String,
}

impl<'a> Builder<'_, 'a> {
    fn fail(&self, reference: &str, failure: Failure, problem: String) -> ResolveError {
        ResolveError {
            field: self.field.clone(),
            reference: reference.to_owned(),
            problem,
            failure,
        }
    }

    fn too_large(&self, reference: &str) -> ResolveError {
        let limit = self.scope.max_bytes;
        let problem = if reference.is_empty() {
            format!(
                "makes the args larger than the limit of {limit} bytes; send less data, or a \
                 reference to part of it"
            )
        } else {
            format!(
                "would make the args larger than the limit of {limit} bytes; reference a \
                 smaller part of the value, or fewer copies of it"
            )
        };
        self.fail(reference, Failure::TooLarge, problem)
    }

    fn too_deep(&self, reference: &str) -> ResolveError {
        let limit = self.scope.max_depth;
        self.fail(
            reference,
            Failure::TooDeep,
            format!("would nest the args deeper than {limit} levels; flatten them"),
        )
    }

    /// Counts `bytes` more.
    fn spend(&mut self, bytes: usize, reference: &str) -> Result<(), ResolveError> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(self.too_large(reference)),
        }
    }

    /// Counts `value`, placed `depth` levels deep, if it fits; `value` is not walked past
    /// what is left of the limits.
    fn take(&mut self, value: &Value, depth: usize, reference: &str) -> Result<(), ResolveError> {
        let depth_left = self.scope.max_depth.saturating_sub(depth);
        match json_size(value, self.left, depth_left) {
            Ok(size) => self.spend(size, reference),
            Err(Over::Bytes) => Err(self.too_large(reference)),
            Err(Over::Depth) => Err(self.too_deep(reference)),
        }
    }

    /// Resolves `value`, which sits `depth` containers deep in the args.
    fn value(&mut self, value: &Value, depth: usize) -> Result<Value, ResolveError> {
        Ok(match value {
            Value::String(text) => match parse(text) {
                Parsed::Whole(r) => match lookup(&r, self.scope, &self.field)? {
                    Some(found) => {
                        self.take(&found, depth, r.text)?;
                        found.into_owned()
                    }
                    None => {
                        self.take(value, depth, "")?;
                        value.clone()
                    }
                },
                Parsed::Text(pieces) if pieces.is_empty() => {
                    self.take(value, depth, "")?;
                    value.clone()
                }
                Parsed::Text(pieces) => Value::String(self.text(text, pieces)?),
            },
            Value::Array(items) => {
                if depth >= self.scope.max_depth {
                    return Err(self.too_deep(""));
                }
                self.spend(2 + items.len().saturating_sub(1), "")?;
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = self.field.len();
                    self.field.push_str(&format!("[{i}]"));
                    out.push(self.value(item, depth + 1)?);
                    self.field.truncate(len);
                }
                Value::Array(out)
            }
            Value::Object(members) => {
                if depth >= self.scope.max_depth {
                    return Err(self.too_deep(""));
                }
                self.spend(2 + members.len().saturating_sub(1), "")?;
                let mut out = Map::with_capacity(members.len());
                for (name, member) in members {
                    let len = self.field.len();
                    self.field.push('.');
                    self.field.push_str(name);
                    self.spend(string_len(name) + 1, "")?;
                    out.insert(name.clone(), self.value(member, depth + 1)?);
                    self.field.truncate(len);
                }
                Value::Object(out)
            }
            other => {
                self.take(other, depth, "")?;
                other.clone()
            }
        })
    }

    /// A string with references written into it; each piece is measured before it is added.
    fn text(&mut self, text: &str, pieces: Vec<Piece<'_>>) -> Result<String, ResolveError> {
        let mut out = String::with_capacity(text.len().min(self.left));
        for piece in pieces {
            match piece {
                Piece::Literal(s) => self.push(&mut out, s, "")?,
                Piece::Reference(r) => match lookup(&r, self.scope, &self.field)? {
                    Some(found) => match found.as_ref() {
                        Value::String(s) => self.push(&mut out, s, r.text)?,
                        other => {
                            let room = self.left.saturating_sub(out.len());
                            match json_size(other, room, self.scope.max_depth) {
                                Ok(_) => self.push(&mut out, &other.to_string(), r.text)?,
                                Err(Over::Bytes) => return Err(self.too_large(r.text)),
                                Err(Over::Depth) => return Err(self.too_deep(r.text)),
                            }
                        }
                    },
                    None => {
                        for part in ["{", r.text, "}"] {
                            self.push(&mut out, part, "")?;
                        }
                    }
                },
            }
        }
        self.spend(string_len(&out), "")?;
        Ok(out)
    }

    /// Adds `piece` to `out` if the string stays within what is left of the limit.
    fn push(&self, out: &mut String, piece: &str, reference: &str) -> Result<(), ResolveError> {
        if out.len().saturating_add(piece.len()) > self.left {
            return Err(self.too_large(reference));
        }
        out.push_str(piece);
        Ok(())
    }
}

/// The value `r` points at; `None` for braces around a name that is not bound here, which
/// stay as they are.
fn lookup<'a>(
    r: &Reference<'_>,
    scope: &Scope<'a>,
    field: &str,
) -> Result<Option<Cow<'a, Value>>, ResolveError> {
    let fail = |problem: String| ResolveError {
        field: field.to_owned(),
        reference: r.text.to_owned(),
        problem,
        failure: Failure::Missing,
    };
    let root = match r.source {
        Source::Step(id) => scope
            .steps
            .get(id)
            .ok_or_else(|| fail(format!("names step `{id}`, which has no output")))?,
        Source::Var(name) => scope
            .var(name)
            .ok_or_else(|| fail(format!("names variable `{name}`, which is not set")))?,
        Source::Binding(name) => match (scope.item, scope.index) {
            (Some((item_name, item)), _) if item_name == name => item,
            (_, Some((index_name, index))) if index_name == name => {
                if r.path.is_empty() {
                    return Ok(Some(Cow::Owned(Value::from(index))));
                }
                return Err(fail("has a path, but the index is a number".to_owned()));
            }
            _ => return Ok(None),
        },
    };
    let mut at = root;
    for (depth, segment) in r.path.iter().enumerate() {
        let next = match at {
            Value::Object(members) => members.get(*segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        at = next.ok_or_else(|| {
            let upto = r.path[..=depth].join(".");
            fail(format!("has no value at `{upto}`"))
        })?;
    }
    Ok(Some(Cow::Borrowed(at)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_and_embedded_references_are_found() {
        let args =
            json!({"a": "$steps.s1.x[0].y", "b": "go {item.name} {x} {$vars.v}", "c": "{index}"});
        let refs = references(&args);
        let sources: Vec<_> = refs.iter().map(|(f, r)| (f.as_str(), r.source)).collect();
        assert_eq!(
            sources,
            vec![
                ("args.a", Source::Step("s1")),
                ("args.b", Source::Binding("item")),
                ("args.b", Source::Binding("x")),
                ("args.b", Source::Var("v")),
                ("args.c", Source::Binding("index")),
            ]
        );
        assert_eq!(refs[0].1.path, vec!["x", "0", "y"]);
    }

    #[test]
    fn braces_that_are_no_reference_stay() {
        let steps = HashMap::new();
        let vars = Map::new();
        let scope = Scope::new(&steps, &vars);
        let args = json!({"t": "{ not a ref } {{x}} $steps. $stepsx {}", "u": "{item.a}"});
        assert_eq!(resolve(&args, &scope).unwrap(), args);
    }
}
