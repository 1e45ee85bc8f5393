//! Whether a value's JSON replays exactly.
//!
//! JSON writes `Some(x)` as plain `x` and `None` as `null`, so a `Some`
//! around a value JSON itself writes as `null` (`()`, a unit struct, `None`,
//! `serde_json::Value::Null`, a NaN or infinite float) comes back as `None`:
//! `Some(())` would replay as `None`. The stored JSON decodes fine, so only a
//! comparison finds it: [`check`] counts the `Some`s around such values in
//! the answer and in its decoded copy; the copy has fewer exactly when a
//! repeat would get `None` where the first call got `Some`. (A type that
//! tells a missing field from `null` by hand, `deserialize_with` a
//! `Some(None)`, decodes back the same, and passes.)

use serde::Serialize;
use serde::ser;

/// `Err` with a message if the decoded copy `back` of `value` lost a `Some`
/// that JSON wrote as `null`: `value` has more of them than `back`.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T, back: &T) -> Result<(), String> {
    if lossy_somes(value)? <= lossy_somes(back)? {
        return Ok(());
    }
    Err("it holds a `Some` around a value JSON writes as `null` (`()`, a unit struct, `None`, `Value::Null`, a NaN \
         or infinite float), which would replay as `None`; return a type that tells them apart (`bool` instead of \
         `Option<()>`, an enum of your own instead of `Option<Option<T>>`)"
        .to_owned())
}

/// How many `Some`s in `value` wrap a value JSON writes as `null`. A count,
/// not a list: the entries of a `HashMap` or `HashSet` come in another order
/// from the decoded copy.
fn lossy_somes<T: Serialize + ?Sized>(value: &T) -> Result<usize, String> {
    let mut n = 0;
    value.serialize(Probe(&mut n)).map_err(|e| e.0)?;
    Ok(n)
}

#[derive(Debug)]
struct Lossy(String);

impl std::fmt::Display for Lossy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Lossy {}

impl ser::Error for Lossy {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        Lossy(msg.to_string())
    }
}

/// Serializes nothing: answers whether the value is written as `null`, and
/// counts the `Some`s around such values.
struct Probe<'a>(&'a mut usize);

/// Whether a value is written as `null`.
type Null = Result<bool, Lossy>;

macro_rules! not_null {
    ($($method:ident($t:ty)),* $(,)?) => {$(
        fn $method(self, _: $t) -> Null {
            Ok(false)
        }
    )*};
}

impl<'a> ser::Serializer for Probe<'a> {
    type Ok = bool;
    type Error = Lossy;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    not_null!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
    );

    // serde_json writes a NaN or an infinity as `null`.
    fn serialize_f32(self, v: f32) -> Null {
        Ok(!v.is_finite())
    }

    fn serialize_f64(self, v: f64) -> Null {
        Ok(!v.is_finite())
    }

    fn serialize_none(self) -> Null {
        Ok(true)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Null {
        if value.serialize(Probe(&mut *self.0))? {
            *self.0 += 1;
        }
        Ok(false)
    }

    fn serialize_unit(self) -> Null {
        Ok(true)
    }

    fn serialize_unit_struct(self, _: &'static str) -> Null {
        Ok(true)
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Null {
        Ok(false)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Null {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Null {
        value.serialize(self).map(|_| false)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Lossy> {
        Ok(self)
    }

    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Lossy> {
        Ok(self)
    }
}

impl Probe<'_> {
    /// Probe one part of a compound value (a compound itself is never
    /// written as `null`).
    fn part<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        value.serialize(Probe(&mut *self.0)).map(|_| ())
    }
}

macro_rules! compound {
    ($($trait:ident :: $method:ident ($($skip:ty)?)),* $(,)?) => {$(
        impl ser::$trait for Probe<'_> {
            type Ok = bool;
            type Error = Lossy;
            fn $method<T: Serialize + ?Sized>(&mut self, $(_: $skip,)? value: &T) -> Result<(), Lossy> {
                self.part(value)
            }
            fn end(self) -> Null {
                Ok(false)
            }
        }
    )*};
}

compound!(
    SerializeSeq::serialize_element(),
    SerializeTuple::serialize_element(),
    SerializeTupleStruct::serialize_field(),
    SerializeTupleVariant::serialize_field(),
    SerializeStruct::serialize_field(&'static str),
    SerializeStructVariant::serialize_field(&'static str),
);

impl ser::SerializeMap for Probe<'_> {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Lossy> {
        self.part(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        self.part(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde::{Deserialize, Serialize};
    use std::collections::{BTreeMap, HashMap};

    #[derive(Serialize, Deserialize, Debug)]
    struct Marker;

    #[derive(Serialize, Deserialize, Debug)]
    struct Wrapped(Option<()>);

    #[derive(Serialize, Deserialize, Debug)]
    struct Receipt {
        id: u64,
        note: Option<String>,
        flags: Vec<Option<bool>>,
    }

    /// A field that tells "absent" (`None`) from "null" (`Some(None)`) by
    /// hand, as serde users do for PATCH bodies: it round-trips.
    #[derive(Serialize, Deserialize, Debug)]
    struct Patch {
        #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "some")]
        email: Option<Option<String>>,
    }

    fn some<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
        T::deserialize(d).map(Some)
    }

    /// What `record::fit` does: encode, decode, compare.
    fn round_trip<T: Serialize + serde::de::DeserializeOwned>(value: &T) -> Result<(), String> {
        let back: T = serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap();
        check(value, &back)
    }

    #[test]
    fn a_some_that_comes_back_none_is_found_wherever_it_sits() {
        assert!(round_trip(&Some(())).is_err());
        assert!(round_trip(&Some(None::<u8>)).is_err());
        assert!(round_trip(&Some(Marker)).is_err());
        assert!(round_trip(&Some(serde_json::Value::Null)).is_err());
        assert!(round_trip(&Some(f64::NAN)).is_err());
        assert!(round_trip(&vec![Some(1.0), Some(f64::INFINITY)]).is_err());
        assert!(round_trip(&vec![None, Some(())]).is_err());
        assert!(round_trip(&Wrapped(Some(()))).is_err());
        assert!(round_trip(&BTreeMap::from([("k".to_owned(), Some(Some(None::<u8>)))])).is_err());
    }

    #[test]
    fn values_that_replay_exactly_pass() {
        assert!(round_trip(&()).is_ok());
        assert!(round_trip(&None::<()>).is_ok());
        assert!(round_trip(&Wrapped(None)).is_ok());
        assert!(round_trip(&Some(Some(0))).is_ok());
        assert!(round_trip(&Some(false)).is_ok());
        assert!(round_trip(&Some(String::new())).is_ok());
        assert!(round_trip(&Some(Vec::<()>::new())).is_ok());
        assert!(round_trip(&Receipt { id: 1, note: None, flags: vec![None, Some(false)] }).is_ok());
        assert!(round_trip(&serde_json::json!({"a": null, "b": [null]})).is_ok());
        assert!(round_trip(&Patch { email: Some(None) }).is_ok());
        assert!(round_trip(&Patch { email: None }).is_ok());
        // Order-free: a map's entries come back in another order.
        let many: HashMap<String, Option<u8>> = (0..50).map(|i| (i.to_string(), (i % 2 == 0).then_some(1))).collect();
        assert!(round_trip(&many).is_ok());
    }
}
