use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{digests, v1_text};

/// Version 2's text of `value`.
fn v2(value: &(impl Serialize + ?Sized)) -> String {
    let mut text = Vec::new();
    value.serialize(super::Writer { out: &mut text, v1_apart: &std::cell::Cell::new(false), in_some: false }).unwrap();
    String::from_utf8(text).unwrap()
}

/// A map that writes one key twice, as `#[serde(flatten)]` of a map
/// holding a field's name does.
struct Twice(&'static str, i64, i64);

impl Serialize for Twice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry(self.0, &self.1)?;
        map.serialize_entry(self.0, &self.2)?;
        map.end()
    }
}

#[derive(Serialize)]
enum Shape {
    Unit,
    Newtype(Option<f64>),
    Tuple(i8, Option<()>),
    Struct { b: Vec<Option<u8>>, a: BTreeMap<i32, f64> },
}

#[derive(Serialize)]
struct Payload {
    z: Option<Option<String>>,
    shapes: Vec<Shape>,
    bytes: serde_bytes_like::Bytes,
    m: HashMap<char, Twice>,
    unit: (),
}

/// `serialize_bytes` without a crate for it.
mod serde_bytes_like {
    pub struct Bytes(pub &'static [u8]);
    impl serde::Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
}

#[test]
fn version_2_tells_apart_what_json_writes_alike() {
    let texts = [
        v2(&f64::NAN),
        v2(&f64::INFINITY),
        v2(&f64::NEG_INFINITY),
        v2(&()),
        v2(&None::<u8>),
        v2(&Some(None::<u8>)),
        v2(&Some(Some(None::<u8>))),
        v2("null"),
    ];
    assert_eq!(texts, ["NaN", "Infinity", "-Infinity", "null", "none", "some none", "some some none", "\"null\""]);
    // An option is transparent where JSON keeps it apart anyway.
    assert_eq!(v2(&Some(5)), "5");
    assert_eq!(v2(&Some(Some(5))), "some 5");
    assert_eq!(v2(&Some(())), "null");
    // A key written twice is kept, each time, in the order written; the
    // others are sorted.
    assert_eq!(v2(&Twice("a", 1, 2)), r#"{"a":1,"a":2}"#);
    assert_eq!(v2(&Twice("a", 2, 1)), r#"{"a":2,"a":1}"#);
    let map: BTreeMap<&str, Twice> = [("y", Twice("k", 1, 2)), ("x", Twice("k", 3, 3))].into_iter().collect();
    assert_eq!(v2(&map), r#"{"x":{"k":3,"k":3},"y":{"k":1,"k":2}}"#);
    assert_eq!(v2(&f32::NAN), "NaN");
    assert_eq!(v2(&-0.0f64), "-0.0");
}

/// Version 1 is written alongside version 2 (one pass), or by 0.2's own
/// code for what cannot be: either way exactly what 0.2 hashed.
#[test]
fn version_1_is_what_0_2_hashed() {
    let payload = Payload {
        z: Some(None),
        shapes: vec![
            Shape::Unit,
            Shape::Newtype(Some(f64::NAN)),
            Shape::Tuple(-1, None),
            Shape::Struct { b: vec![None, Some(1)], a: [(2, 0.5), (-1, f64::NEG_INFINITY)].into_iter().collect() },
        ],
        bytes: serde_bytes_like::Bytes(b"\x00\xff"),
        m: [('q', Twice("k", 1, 2)), ('"', Twice("\"", 2, 1))].into_iter().collect(),
        unit: (),
    };
    let json: serde_json::Value =
        serde_json::from_str(r#"{"b":[1,2.5,{"y":null,"x":"\"q\":"}],"a":-3,"c":1.0,"d":{"a!":1,"a":2}}"#).unwrap();
    let sha = |text: Vec<u8>| -> [u8; 32] { Sha256::digest(text).into() };
    let check = |name: &str, d: super::Digests, old: Vec<u8>| assert_eq!(d.v1, Some(sha(old)), "{name}");
    check("payload", digests(&payload).unwrap(), v1_text(&payload).unwrap());
    check("json", digests(&json).unwrap(), v1_text(&json).unwrap());
    check("twice", digests(&Twice("a", 1, 2)).unwrap(), v1_text(&Twice("a", 1, 2)).unwrap());
    check("nan", digests(&[f64::NAN]).unwrap(), v1_text(&[f64::NAN]).unwrap());
    check("f32", digests(&(0.1f32, f32::NAN)).unwrap(), v1_text(&(0.1f32, f32::NAN)).unwrap());
    check("u128", digests(&[u128::MAX]).unwrap(), v1_text(&[u128::MAX]).unwrap());
    check("i128", digests(&[i128::MIN, 1]).unwrap(), v1_text(&[i128::MIN, 1]).unwrap());
    // Where the texts do not differ, the versions are one hash.
    let plain = digests(&json).unwrap();
    assert_eq!(plain.v1, Some(plain.v2));
    assert_ne!(digests(&payload).unwrap().v1, Some(digests(&payload).unwrap().v2));
}

#[test]
fn map_keys_follow_serde_json_s_rules() {
    let keys: BTreeMap<i64, bool> = [(10, true), (9, false)].into_iter().collect();
    // Sorted as text, as 0.2 sorted them.
    assert_eq!(v2(&keys), r#"{"10":true,"9":false}"#);
    let floats: Vec<(f64, u8)> = vec![(0.5, 1)];
    let floats: HashMap<String, u8> =
        floats.into_iter().map(|(k, v)| (serde_json::to_string(&k).unwrap(), v)).collect();
    assert_eq!(v2(&floats), r#"{"0.5":1}"#);
    let tuple_keys: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
    assert!(digests(&tuple_keys).is_err(), "serde_json refuses a key that is no string, and so does 0.2");
    assert!(v1_text(&tuple_keys).is_err());
}
