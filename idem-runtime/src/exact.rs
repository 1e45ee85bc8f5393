//! Whether a value's JSON replays exactly.
//!
//! JSON writes `Some(x)` as plain `x` and `None` as `null`, so a `Some`
//! around a value JSON itself writes as `null` (`()`, a unit struct, `None`,
//! `serde_json::Value::Null`) comes back as `None`: `Some(())` would replay
//! as `None`. [`check`] walks the value as serde presents it and finds such
//! a `Some`, so the first call fails with a clear error instead of every
//! repeat silently getting another answer.

use serde::Serialize;
use serde::ser;

/// `Err` with a message if some `Some` in `value` would replay as `None`.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), String> {
    value.serialize(Probe).map(|_| ()).map_err(|e| e.0)
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

/// Serializes nothing: answers whether the value is written as `null`.
struct Probe;

/// Whether a value is written as `null`.
type Null = Result<bool, Lossy>;

fn walk<T: Serialize + ?Sized>(value: &T) -> Result<(), Lossy> {
    value.serialize(Probe).map(|_| ())
}

macro_rules! not_null {
    ($($method:ident($t:ty)),* $(,)?) => {$(
        fn $method(self, _: $t) -> Null {
            Ok(false)
        }
    )*};
}

impl ser::Serializer for Probe {
    type Ok = bool;
    type Error = Lossy;
    type SerializeSeq = Parts;
    type SerializeTuple = Parts;
    type SerializeTupleStruct = Parts;
    type SerializeTupleVariant = Parts;
    type SerializeMap = Parts;
    type SerializeStruct = Parts;
    type SerializeStructVariant = Parts;

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
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
    );

    fn serialize_none(self) -> Null {
        Ok(true)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Null {
        if value.serialize(Probe)? {
            return Err(Lossy(
                "it holds a `Some` around a value JSON writes as `null` (`()`, a unit struct, `None`, \
                 `Value::Null`), which would replay as `None`; return a type that tells them apart \
                 (`bool` instead of `Option<()>`, an enum of your own instead of `Option<Option<T>>`)"
                    .to_owned(),
            ));
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
        value.serialize(Probe)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Null {
        walk(value).map(|()| false)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_tuple(self, _: usize) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Parts, Lossy> {
        Ok(Parts)
    }

    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Parts, Lossy> {
        Ok(Parts)
    }
}

/// The parts of a compound value, each probed; the compound itself is
/// never written as `null`.
struct Parts;

impl ser::SerializeSeq for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeTuple for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeTupleStruct for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeTupleVariant for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeMap for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Lossy> {
        walk(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeStruct for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

impl ser::SerializeStructVariant for Parts {
    type Ok = bool;
    type Error = Lossy;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Result<(), Lossy> {
        walk(value)
    }
    fn end(self) -> Null {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use std::collections::BTreeMap;

    #[derive(serde::Serialize)]
    struct Marker;

    #[derive(serde::Serialize)]
    struct Wrapped(Option<()>);

    #[derive(serde::Serialize)]
    struct Receipt {
        id: u64,
        note: Option<String>,
        flags: Vec<Option<bool>>,
    }

    #[test]
    fn a_some_written_as_null_is_found_wherever_it_sits() {
        assert!(check(&Some(())).is_err());
        assert!(check(&Some(None::<u8>)).is_err());
        assert!(check(&Some(Marker)).is_err());
        assert!(check(&Some(serde_json::Value::Null)).is_err());
        assert!(check(&vec![None, Some(())]).is_err());
        assert!(check(&Wrapped(Some(()))).is_err());
        assert!(check(&BTreeMap::from([("k", Some(Some(None::<u8>)))])).is_err());
    }

    #[test]
    fn values_that_replay_exactly_pass() {
        assert!(check(&()).is_ok());
        assert!(check(&None::<()>).is_ok());
        assert!(check(&Wrapped(None)).is_ok());
        assert!(check(&Some(Some(0))).is_ok());
        assert!(check(&Some(false)).is_ok());
        assert!(check(&Some("")).is_ok());
        assert!(check(&Some(Vec::<()>::new())).is_ok());
        assert!(check(&Receipt { id: 1, note: None, flags: vec![None, Some(false)] }).is_ok());
        assert!(check(&serde_json::json!({"a": null, "b": [null]})).is_ok());
    }
}
