//! JSON as the contract takes it: I-JSON (RFC 7493).
//!
//! serde_json reads more than I-JSON. A repeated member name silently replaces the earlier
//! value, members that a type ignores are skipped without their numbers or strings being
//! checked, and serde's derive takes a sequence of a struct's fields in place of an object.
//! [`IJsonValue`] reads any JSON value and visits every member, so that serde_json checks
//! every number and string, and refuses a repeated name. [`object`] and [`optional_name`]
//! hold the envelope's structs to objects and its names to strings.

use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, StrDeserializer};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use crate::contract::serde_message::NotIJson;

/// What a repeated member name gets.
const REPEATED: &str =
    "must be unique: the name appears twice in its object; send each member once";
/// What a number that no double holds gets.
const NOT_A_DOUBLE: &str =
    "must be a number that a double can hold; send a larger number as a string";
/// What text that is not Unicode gets.
const NOT_UNICODE: &str =
    "must be valid Unicode: UTF-8 text without lone surrogates; send the text as UTF-8";
/// What a sequence in place of an object gets.
const NOT_AN_OBJECT: &str = "must be a JSON object, got an array";

/// What to say of a member that serde_json found `problem` in.
pub(super) fn problem(problem: NotIJson) -> &'static str {
    match problem {
        NotIJson::Number => NOT_A_DOUBLE,
        NotIJson::Unicode => NOT_UNICODE,
    }
}

/// A JSON value read as I-JSON: every member visited, no name twice in an object, every
/// number finite.
pub(crate) struct IJsonValue(pub(crate) Value);

impl<'de> Deserialize<'de> for IJsonValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IJsonVisitor).map(IJsonValue)
    }
}

struct IJsonVisitor;

impl<'de> Visitor<'de> for IJsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(NOT_A_DOUBLE))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        IJsonValue::deserialize(deserializer).map(|IJsonValue(value)| value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(IJsonValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                // Refused where the repeated member's value begins, so that the error's path
                // names the member.
                return map.next_value_seed(Repeated).map(|never| match never {});
            }
            let IJsonValue(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

/// The value of a repeated member: always refused.
struct Repeated;

impl<'de> DeserializeSeed<'de> for Repeated {
    type Value = Infallible;

    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<Infallible, D::Error> {
        Err(de::Error::custom(REPEATED))
    }
}

/// Deserializes a struct from a JSON object only; serde's derive alone would also take the
/// struct's fields as a sequence.
pub(super) fn object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Object::deserialize(deserializer).map(|Object(value)| value)
}

/// [`object`] for an optional member; `null` is `None`.
pub(super) fn optional_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Object<T>>::deserialize(deserializer).map(|found| found.map(|Object(value)| value))
}

/// Deserializes a unit variant of an enum from a JSON string only; serde alone would also
/// take `{"variant": null}`. `null` is `None`.
pub(super) fn optional_name<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Option::<Name<T>>::deserialize(deserializer).map(|found| found.map(|Name(value)| value))
}

struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Object)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Object<T>, A::Error> {
        Err(de::Error::custom(NOT_AN_OBJECT))
    }
}

struct Name<T>(T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Name<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(NameVisitor(PhantomData))
    }
}

struct NameVisitor<T>(PhantomData<T>);

impl<T: DeserializeOwned> Visitor<'_> for NameVisitor<T> {
    type Value = Name<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Name<T>, E> {
        T::deserialize(StrDeserializer::<E>::new(v)).map(Name)
    }
}
