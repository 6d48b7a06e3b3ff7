//! References in a step's args, resolved before dispatch: pure functions of the args and
//! what the run knows.
//!
//! - A string that is a whole reference becomes the value it points at, of any type:
//!   `"$steps.search.hits.0"`, `"$vars.city"`, `"{item.path}"`, `"{index}"`.
//! - A reference in braces inside a longer string is written into it (strings as they are,
//!   other values as JSON): `"Hotels in {$steps.flights.city} for {item.name}"`.
//! - A path goes down objects by member name and arrays by index: `a.b.0` or `a.b[0]`.
//! - Braces around anything else are kept as they are.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

/// What a run knows when it resolves a step's args: the outputs of the finished steps, the
/// variables, and in a `foreach`, the item and its index.
///
/// ```
/// use std::collections::HashMap;
/// use serde_json::{json, Map};
/// use tower_toolcall::executor::{resolve, Scope};
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
/// # Ok::<(), tower_toolcall::executor::ResolveError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    steps: &'a HashMap<String, Value>,
    vars: &'a Map<String, Value>,
    item: Option<(&'a str, &'a Value)>,
    index: Option<(&'a str, u64)>,
}

impl<'a> Scope<'a> {
    /// The outputs of the finished steps (by step id) and the variables.
    pub fn new(steps: &'a HashMap<String, Value>, vars: &'a Map<String, Value>) -> Self {
        Scope {
            steps,
            vars,
            item: None,
            index: None,
        }
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
}

impl ResolveError {
    /// The path of the member of the args that holds the reference, e.g. `args.query`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The reference as written.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// Why it cannot be resolved.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}`: reference `{}` {}",
            self.field, self.reference, self.problem
        )
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

fn is_name(name: &str) -> bool {
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

/// `true` when no string in `value` could hold a reference (none has `$` or `{`): it
/// resolves to itself, and its args can be checked before the run.
pub(crate) fn is_static(value: &Value) -> bool {
    match value {
        Value::String(text) => !text.contains(['$', '{']),
        Value::Array(items) => items.iter().all(is_static),
        Value::Object(members) => members.values().all(is_static),
        _ => true,
    }
}

/// Resolves every reference in `args` against `scope`; the args are not changed.
///
/// A reference to a step that has not finished, a variable that is not set, a binding outside
/// a `foreach`, or a path that is not in the value, is an error naming the member.
pub fn resolve(args: &Value, scope: &Scope<'_>) -> Result<Value, ResolveError> {
    if is_static(args) {
        return Ok(args.clone());
    }
    let mut field = String::from("args");
    resolve_value(args, scope, &mut field)
}

fn resolve_value(
    value: &Value,
    scope: &Scope<'_>,
    field: &mut String,
) -> Result<Value, ResolveError> {
    Ok(match value {
        Value::String(text) => match parse(text) {
            Parsed::Whole(r) => lookup(&r, scope, field)?.unwrap_or_else(|| value.clone()),
            Parsed::Text(pieces) if pieces.is_empty() => value.clone(),
            Parsed::Text(pieces) => {
                let mut out = String::with_capacity(text.len());
                for piece in pieces {
                    match piece {
                        Piece::Literal(s) => out.push_str(s),
                        Piece::Reference(r) => match lookup(&r, scope, field)? {
                            Some(Value::String(s)) => out.push_str(&s),
                            Some(other) => out.push_str(&other.to_string()),
                            None => {
                                out.push('{');
                                out.push_str(r.text);
                                out.push('}');
                            }
                        },
                    }
                }
                Value::String(out)
            }
        },
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = field.len();
                field.push_str(&format!("[{i}]"));
                out.push(resolve_value(item, scope, field)?);
                field.truncate(len);
            }
            Value::Array(out)
        }
        Value::Object(members) => {
            let mut out = Map::with_capacity(members.len());
            for (name, member) in members {
                let len = field.len();
                field.push('.');
                field.push_str(name);
                out.insert(name.clone(), resolve_value(member, scope, field)?);
                field.truncate(len);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// The value `r` points at; `None` for braces around a name that is not bound here, which
/// stay as they are.
fn lookup(
    r: &Reference<'_>,
    scope: &Scope<'_>,
    field: &str,
) -> Result<Option<Value>, ResolveError> {
    let fail = |problem: String| ResolveError {
        field: field.to_owned(),
        reference: r.text.to_owned(),
        problem,
    };
    let root = match r.source {
        Source::Step(id) => scope
            .steps
            .get(id)
            .ok_or_else(|| fail(format!("names step `{id}`, which has no output")))?,
        Source::Var(name) => scope
            .vars
            .get(name)
            .ok_or_else(|| fail(format!("names variable `{name}`, which is not set")))?,
        Source::Binding(name) => match (scope.item, scope.index) {
            (Some((item_name, item)), _) if item_name == name => item,
            (_, Some((index_name, index))) if index_name == name => {
                if r.path.is_empty() {
                    return Ok(Some(Value::from(index)));
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
    Ok(Some(at.clone()))
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
