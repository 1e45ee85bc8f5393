//! The canonical text written straight from `Serialize`, with no
//! `serde_json::Value` in between (which keeps one value of a key written
//! twice, and turns NaN and the infinities into `null`).
//!
//! Version 2's text is JSON as `serde_json` writes it, objects' keys sorted,
//! but for what JSON cannot tell apart: `NaN`, `Infinity` and `-Infinity`
//! for the non-finite floats, `none` for `None` (`null` stays the unit's,
//! a `serde_json::Value`'s null included), `some ` before an option inside
//! a `Some` (`Some(None)` is `some none`), and a key written twice kept,
//! each time, in the order written. Version 1's text (what 0.2 hashed) is
//! written alongside where the two differ: `null` for all of those, the
//! last value of a repeated key.

use std::borrow::Cow;
use std::cell::Cell;
use std::io;
use std::ops::Range;

use serde::Serialize;
use serde::ser::{self, Error as _, Impossible};
use sha2::{Digest, Sha256};

type Error = serde_json::Error;

/// Where the text goes. Both versions share most of it; where they differ
/// both are given.
pub(super) trait Sink {
    /// Text of both versions.
    fn both(&mut self, text: &[u8]);
    /// Version 2's text, and version 1's in its place.
    fn split(&mut self, v2: &[u8], v1: &[u8]);
}

/// Both texts hashed as they are written: version 1's hash is forked from
/// version 2's where the texts first differ (until then they are one).
pub(super) struct Hashes {
    pub(super) v2: Sha256,
    pub(super) v1: Option<Sha256>,
}

impl Sink for Hashes {
    fn both(&mut self, text: &[u8]) {
        self.v2.update(text);
        if let Some(v1) = &mut self.v1 {
            v1.update(text);
        }
    }

    fn split(&mut self, v2: &[u8], v1: &[u8]) {
        self.v1.get_or_insert_with(|| self.v2.clone()).update(v1);
        self.v2.update(v2);
    }
}

/// Version 2's text alone (the doors': JSON text never has a difference).
impl Sink for Vec<u8> {
    fn both(&mut self, text: &[u8]) {
        self.extend_from_slice(text);
    }

    fn split(&mut self, v2: &[u8], _: &[u8]) {
        self.extend_from_slice(v2);
    }
}

/// Leaves as `serde_json` writes them, into both versions.
struct Both<'a, S>(&'a mut S);

impl<S: Sink> io::Write for Both<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.both(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A map's entries (`"key":value`) as written, sorted when the map ends.
/// Version 1's text of an entry is kept only from where it first differs
/// (copied then): most entries have none.
#[derive(Default)]
struct Entries {
    v2: Vec<u8>,
    v1: Vec<u8>,
    list: Vec<Entry>,
    /// A key was written and its value not yet.
    open: bool,
}

struct Entry {
    key: Cow<'static, str>,
    v2: Range<usize>,
    v1: Option<Range<usize>>,
}

impl Sink for Entries {
    fn both(&mut self, text: &[u8]) {
        self.v2.extend_from_slice(text);
        if self.list.last().is_some_and(|e| e.v1.is_some()) {
            self.v1.extend_from_slice(text);
        }
    }

    fn split(&mut self, v2: &[u8], v1: &[u8]) {
        // A value is written after its key: there is an entry.
        if let Some(entry) = self.list.last_mut()
            && entry.v1.is_none()
        {
            let start = self.v1.len();
            self.v1.extend_from_slice(&self.v2[entry.v2.start..]);
            entry.v1 = Some(start..start);
        }
        self.v2.extend_from_slice(v2);
        self.v1.extend_from_slice(v1);
    }
}

impl Entries {
    fn key(&mut self, key: Cow<'static, str>) -> Result<(), Error> {
        let start = self.v2.len();
        serde_json::to_writer(&mut self.v2, key.as_ref())?;
        self.v2.push(b':');
        self.list.push(Entry { key, v2: start..start, v1: None });
        self.open = true;
        Ok(())
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T, v1_apart: &Cell<bool>) -> Result<(), Error> {
        if !std::mem::take(&mut self.open) {
            return Err(Error::custom("a map value was serialized before its key"));
        }
        value.serialize(Writer { out: self, v1_apart, in_some: false })?;
        if let Some(entry) = self.list.last_mut() {
            entry.v2.end = self.v2.len();
            if let Some(v1) = &mut entry.v1 {
                v1.end = self.v1.len();
            }
        }
        Ok(())
    }

    /// The object, its entries sorted by key (stably: a repeated key's
    /// entries stay in the order written). Version 1 keeps the last of
    /// them, as a `serde_json::Value` does. Written piece by piece, so that
    /// the texts part only where an entry's do.
    fn write_to<S: Sink>(mut self, out: &mut S) {
        self.list.sort_by(|a, b| a.key.cmp(&b.key));
        out.both(b"{");
        let mut v1_empty = true;
        for (i, entry) in self.list.iter().enumerate() {
            let v2 = &self.v2[entry.v2.clone()];
            let superseded = self.list.get(i + 1).is_some_and(|next| next.key == entry.key);
            let v1: &[u8] = match &entry.v1 {
                _ if superseded => b"",
                Some(range) => &self.v1[range.clone()],
                None => v2,
            };
            let comma = |first| if first { &b""[..] } else { &b","[..] };
            pair(out, comma(i == 0), comma(v1_empty || superseded));
            pair(out, v2, v1);
            v1_empty &= superseded;
        }
        out.both(b"}");
    }
}

/// `v2` and `v1` into `out`, as one text where they are one.
fn pair<S: Sink>(out: &mut S, v2: &[u8], v1: &[u8]) {
    if std::ptr::eq(v2, v1) || v2 == v1 { out.both(v2) } else { out.split(v2, v1) }
}

/// `serde_json`'s name of the struct an `arbitrary_precision` number
/// serializes as: its one field is the number's text.
const NUMBER: &str = "$serde_json::private::Number";
/// The same for a `RawValue` (feature `raw_value`): its field is JSON text.
const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// Serializer methods of plain values answered alike, by `$body`.
macro_rules! leaves {
    ($ret:ty, |$self:ident, $v:ident| $body:expr, $($method:ident: $t:ty),+) => {$(
        fn $method($self, $v: $t) -> $ret {
            $body
        }
    )+};
}

/// The serializer: writes a value's text into `out`.
pub(super) struct Writer<'a, S> {
    pub(super) out: &'a mut S,
    /// Set when version 1 cannot be written alongside: the value is one
    /// 0.2 hashed otherwise (see `digests`).
    pub(super) v1_apart: &'a Cell<bool>,
    /// The value is a `Some`'s: an option here is marked.
    pub(super) in_some: bool,
}

impl<'a, S: Sink> Writer<'a, S> {
    fn json<T: Serialize + ?Sized>(self, leaf: &T) -> Result<(), Error> {
        serde_json::to_writer(Both(self.out), leaf)
    }

    /// A float JSON has no number for: a name of its own in version 2,
    /// `null` in version 1.
    fn non_finite(self, nan: bool, negative: bool) -> Result<(), Error> {
        let name: &[u8] = match (nan, negative) {
            (true, _) => b"NaN",
            (false, false) => b"Infinity",
            (false, true) => b"-Infinity",
        };
        self.out.split(name, b"null");
        Ok(())
    }

    fn seq(self, open: &[u8], close: &'static [u8]) -> Seq<'a, S> {
        self.out.both(open);
        Seq { out: self.out, v1_apart: self.v1_apart, first: true, close }
    }

    fn map(self, close: &'static [u8]) -> Map<'a, S> {
        Map { out: self.out, v1_apart: self.v1_apart, entries: Entries::default(), close, number: false }
    }

    /// `{"variant":` of a variant with data.
    fn variant(&mut self, variant: &str) -> Result<(), Error> {
        self.out.both(b"{");
        serde_json::to_writer(Both(&mut *self.out), variant)?;
        self.out.both(b":");
        Ok(())
    }
}

impl<'a, S: Sink> ser::Serializer for Writer<'a, S> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a, S>;
    type SerializeTuple = Seq<'a, S>;
    type SerializeTupleStruct = Seq<'a, S>;
    type SerializeTupleVariant = Seq<'a, S>;
    type SerializeMap = Map<'a, S>;
    type SerializeStruct = Map<'a, S>;
    type SerializeStructVariant = Map<'a, S>;

    leaves!(
        Result<(), Error>,
        |self, v| self.json(&v),
        serialize_bool: bool,
        serialize_i8: i8,
        serialize_i16: i16,
        serialize_i32: i32,
        serialize_i64: i64,
        serialize_u8: u8,
        serialize_u16: u16,
        serialize_u32: u32,
        serialize_u64: u64,
        serialize_char: char
    );

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        // Past 64 bits a `Value` holds no number: 0.2 hashed the plain JSON.
        if i64::try_from(v).is_err() && u64::try_from(v).is_err() {
            self.v1_apart.set(true);
        }
        self.json(&v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        if u64::try_from(v).is_err() {
            self.v1_apart.set(true);
        }
        self.json(&v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        // A `Value` widens it to an f64, or with serde_json's
        // `arbitrary_precision` keeps its own digits: 0.2's text depends on
        // a feature of the application's build.
        self.v1_apart.set(true);
        if v.is_finite() { self.json(&v) } else { self.non_finite(v.is_nan(), v < 0.0) }
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        if v.is_finite() { self.json(&v) } else { self.non_finite(v.is_nan(), v < 0.0) }
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.json(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // A list of numbers, as a `Value` holds them.
        self.json(&v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.split(if self.in_some { b"some none" } else { b"none" }, b"null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        if self.in_some {
            self.out.split(b"some ", b"");
        }
        value.serialize(Writer { in_some: true, ..self })
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.both(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), Error> {
        self.json(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Error> {
        // Transparent, a `Some` around it included.
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.variant(variant)?;
        value.serialize(Writer { out: &mut *self.out, v1_apart: self.v1_apart, in_some: false })?;
        self.out.both(b"}");
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Seq<'a, S>, Error> {
        Ok(self.seq(b"[", b"]"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Seq<'a, S>, Error> {
        Ok(self.seq(b"[", b"]"))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Seq<'a, S>, Error> {
        Ok(self.seq(b"[", b"]"))
    }
    fn serialize_tuple_variant(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Seq<'a, S>, Error> {
        self.variant(variant)?;
        Ok(self.seq(b"[", b"]}"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Map<'a, S>, Error> {
        Ok(self.map(b""))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Map<'a, S>, Error> {
        if name == RAW_VALUE {
            // Kept as its text here; 0.2 hashed it parsed.
            self.v1_apart.set(true);
        }
        let number = name == NUMBER;
        Ok(Map { number, ..self.map(b"") })
    }
    fn serialize_struct_variant(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Map<'a, S>, Error> {
        self.variant(variant)?;
        Ok(self.map(b"}"))
    }
}

/// A list: a sequence, a tuple, a tuple variant's fields.
pub(super) struct Seq<'a, S> {
    out: &'a mut S,
    v1_apart: &'a Cell<bool>,
    first: bool,
    close: &'static [u8],
}

impl<S: Sink> Seq<'_, S> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !std::mem::take(&mut self.first) {
            self.out.both(b",");
        }
        value.serialize(Writer { out: &mut *self.out, v1_apart: self.v1_apart, in_some: false })
    }

    fn close(self) -> Result<(), Error> {
        self.out.both(self.close);
        Ok(())
    }
}

/// serde's traits of a list or an object, which a `Seq` (a `Map`) answers
/// alike: each element or field through `$via`, the end through `close`.
macro_rules! compound {
    ($ty:ident, $via:ident, $($trait:ident::$method:ident($($key:ident: $key_ty:ty)?)),+) => {$(
        impl<S: Sink> ser::$trait for $ty<'_, S> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, $($key: $key_ty,)? value: &T) -> Result<(), Error> {
                self.$via($($key,)? value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )+};
}

compound!(
    Seq,
    element,
    SerializeSeq::serialize_element(),
    SerializeTuple::serialize_element(),
    SerializeTupleStruct::serialize_field(),
    SerializeTupleVariant::serialize_field()
);

/// An object: a map, a struct, a struct variant's fields.
pub(super) struct Map<'a, S> {
    out: &'a mut S,
    v1_apart: &'a Cell<bool>,
    entries: Entries,
    close: &'static [u8],
    /// An `arbitrary_precision` number: its field's text is written as is.
    number: bool,
}

impl<S: Sink> Map<'_, S> {
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        if self.number {
            let serde_json::Value::String(digits) = serde_json::to_value(value)? else {
                return Err(Error::custom("a serde_json number without its digits"));
            };
            self.out.both(digits.as_bytes());
            return Ok(());
        }
        self.entries.key(Cow::Borrowed(key))?;
        self.entries.value(value, self.v1_apart)
    }

    fn close(self) -> Result<(), Error> {
        if !self.number {
            self.entries.write_to(self.out);
        }
        self.out.both(self.close);
        Ok(())
    }
}

impl<S: Sink> ser::SerializeMap for Map<'_, S> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        let key = key.serialize(KeyText)?;
        self.entries.key(Cow::Owned(key))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.entries.value(value, self.v1_apart)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

compound!(
    Map,
    field,
    SerializeStruct::serialize_field(key: &'static str),
    SerializeStructVariant::serialize_field(key: &'static str)
);

/// A map key as the text JSON gives it, by serde_json's rules: strings,
/// characters, booleans, integers, finite floats, unit variants (and
/// newtypes of these); anything else is refused, as serde_json refuses it.
struct KeyText;

fn not_a_key() -> Error {
    Error::custom("key must be a string")
}

impl ser::Serializer for KeyText {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = Impossible<String, Error>;
    type SerializeTuple = Impossible<String, Error>;
    type SerializeTupleStruct = Impossible<String, Error>;
    type SerializeTupleVariant = Impossible<String, Error>;
    type SerializeMap = Impossible<String, Error>;
    type SerializeStruct = Impossible<String, Error>;
    type SerializeStructVariant = Impossible<String, Error>;

    leaves!(
        Result<String, Error>,
        |self, v| Ok(v.to_string()),
        serialize_bool: bool,
        serialize_i8: i8,
        serialize_i16: i16,
        serialize_i32: i32,
        serialize_i64: i64,
        serialize_i128: i128,
        serialize_u8: u8,
        serialize_u16: u16,
        serialize_u32: u32,
        serialize_u64: u64,
        serialize_u128: u128,
        serialize_char: char
    );

    fn serialize_f32(self, v: f32) -> Result<String, Error> {
        float_key(v.is_finite(), &v)
    }
    fn serialize_f64(self, v: f64) -> Result<String, Error> {
        float_key(v.is_finite(), &v)
    }
    fn serialize_str(self, v: &str) -> Result<String, Error> {
        Ok(v.to_owned())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_none(self) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_unit(self) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<String, Error> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<String, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, Error> {
        Err(not_a_key())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_a_key())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_a_key())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(not_a_key())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_a_key())
    }
}

/// A float key in serde_json's digits; a non-finite one is refused, as
/// serde_json refuses it.
fn float_key<F: Serialize>(finite: bool, v: &F) -> Result<String, Error> {
    if finite { serde_json::to_string(v) } else { Err(Error::custom("float key must be finite (got NaN or +/-inf)")) }
}
