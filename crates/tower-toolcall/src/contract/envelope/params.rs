use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::de::{self, Deserialize, Deserializer};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use super::ijson::IJsonValue;
use crate::contract::canonical::{self, CanonicalOptions};
use crate::contract::error::ToolError;

/// The params of a call: a JSON object behind an [`Arc`], so cloning a call never copies
/// them.
///
/// The canonical form of the params (see [`canonical`](crate::canonical)) is computed at
/// most once per value and shared by every clone, so that loop detection and idempotency
/// do not canonicalize the same params twice.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall::canonical::CanonicalOptions;
/// use tower_toolcall::Params;
///
/// let params = Params::from_value(json!({"b": 1, "a": " x "})).unwrap();
/// let copy = params.clone(); // O(1)
/// let canonical = copy.canonical(&CanonicalOptions::default()).unwrap();
/// assert_eq!(canonical, r#"{"a":"x","b":1}"#);
/// // Computed once: every clone borrows the same string.
/// let again = params.canonical(&CanonicalOptions::default()).unwrap();
/// assert!(std::ptr::eq(canonical.as_ptr(), again.as_ptr()));
/// ```
#[derive(Clone)]
pub struct Params {
    inner: Arc<ParamsInner>,
}

#[derive(Clone)]
struct ParamsInner {
    value: Value,
    canonical: OnceLock<CachedCanonical>,
}

#[derive(Clone)]
struct CachedCanonical {
    options: CanonicalOptions,
    canonical: Result<Arc<str>, ToolError>,
}

impl Params {
    /// Empty params, `{}`.
    pub fn empty() -> Self {
        Params::from_map(Map::new())
    }

    /// Params from a JSON object.
    pub fn from_map(map: Map<String, Value>) -> Self {
        Params {
            inner: Arc::new(ParamsInner {
                value: Value::Object(map),
                canonical: OnceLock::new(),
            }),
        }
    }

    /// Params from a JSON value, which must be an object; the error names `payload.params`.
    pub fn from_value(value: Value) -> Result<Self, ToolError> {
        match value {
            Value::Object(map) => Ok(Params::from_map(map)),
            other => Err(ToolError::invalid_field(
                "payload.params",
                format_args!("must be a JSON object, got {}", json_kind(&other)),
            )),
        }
    }

    /// The params as a JSON value (always an object).
    pub fn as_value(&self) -> &Value {
        &self.inner.value
    }

    /// The params' members.
    pub fn as_map(&self) -> &Map<String, Value> {
        match &self.inner.value {
            Value::Object(map) => map,
            _ => unreachable!("Params always hold an object"),
        }
    }

    /// The members, by value: moved out when no other clone shares them, else copied.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall::Params;
    ///
    /// let params = Params::from_value(json!({"q": "tower"})).unwrap();
    /// assert_eq!(params.into_map()["q"], "tower");
    /// ```
    pub fn into_map(self) -> Map<String, Value> {
        let value = Arc::try_unwrap(self.inner)
            .map(|inner| inner.value)
            .unwrap_or_else(|shared| shared.value.clone());
        match value {
            Value::Object(map) => map,
            _ => unreachable!("Params always hold an object"),
        }
    }

    /// Mutable access to the members. Copies them first if another clone shares them, and
    /// forgets the cached canonical form.
    pub fn make_mut(&mut self) -> &mut Map<String, Value> {
        let inner = Arc::make_mut(&mut self.inner);
        inner.canonical = OnceLock::new();
        match &mut inner.value {
            Value::Object(map) => map,
            _ => unreachable!("Params always hold an object"),
        }
    }

    /// The canonical JSON of the params under `options`, computed once and shared by every
    /// clone: borrowed from the cache when `options` are the cached ones, computed afresh
    /// (and not cached) for other options.
    pub fn canonical(&self, options: &CanonicalOptions) -> Result<Cow<'_, str>, ToolError> {
        match self.cached(options) {
            Some(cached) => match &cached.canonical {
                Ok(canonical) => Ok(Cow::Borrowed(canonical)),
                Err(error) => Err(error.clone()),
            },
            None => canonical::canonical_json(&self.inner.value, options).map(Cow::Owned),
        }
    }

    /// `hex(sha256(canonical))` of the params under `options`: the digest of
    /// [`canonical`](Params::canonical).
    pub fn digest(&self, options: &CanonicalOptions) -> Result<String, ToolError> {
        Ok(canonical::params_digest(&self.canonical(options)?))
    }

    fn cached(&self, options: &CanonicalOptions) -> Option<&CachedCanonical> {
        let cached = self.inner.canonical.get_or_init(|| CachedCanonical {
            options: options.clone(),
            canonical: canonical::canonical_json_shared(&self.inner.value, options),
        });
        (cached.options == *options).then_some(cached)
    }
}

impl Default for Params {
    fn default() -> Self {
        Params::empty()
    }
}

impl fmt::Debug for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner.value, f)
    }
}

impl PartialEq for Params {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner.value == other.inner.value
    }
}

impl Serialize for Params {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.inner.value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Params {
    /// Reads the params as I-JSON: an object in which no member name appears twice, at any
    /// depth.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match IJsonValue::deserialize(deserializer)?.0 {
            Value::Object(map) => Ok(Params::from_map(map)),
            other => Err(de::Error::custom(format_args!(
                "must be a JSON object, got {}",
                json_kind(&other)
            ))),
        }
    }
}

impl TryFrom<Value> for Params {
    type Error = ToolError;

    fn try_from(value: Value) -> Result<Self, ToolError> {
        Params::from_value(value)
    }
}

/// What kind of JSON value `value` is, as a message names it (`a string`, `an array`, …),
/// for the errors of every edge that reads JSON from a caller.
///
/// ```
/// use tower_toolcall::envelope::json_kind;
///
/// assert_eq!(json_kind(&serde_json::json!(42)), "a number");
/// ```
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
