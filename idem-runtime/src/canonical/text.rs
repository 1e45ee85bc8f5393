//! A request body's JSON text as canonical text (the doors'), where
//! parsing it loses nothing that tells two texts apart.

use serde_json::Value;

/// JSON text as canonical JSON, or `None` (compare the bytes) if it does
/// not parse, or if parsing would lose what tells two texts apart: a
/// number JSON holds more exactly than a 64-bit integer or float
/// (`1.000000000000000001`, an integer past `u64`) or not in the form it
/// would be written back (`1e2`), or an object with a key twice (which
/// readers take differently).
pub(crate) fn from_text(text: &[u8]) -> Option<Vec<u8>> {
    let value: Value = serde_json::from_slice(text).ok()?;
    let (keys, exact) = scan(text);
    if !exact || keys != entries(&value) {
        return None;
    }
    super::to_vec(&value).ok()
}

/// How many object entries a value holds, at every level.
fn entries(value: &Value) -> usize {
    match value {
        Value::Object(map) => map.len() + map.values().map(entries).sum::<usize>(),
        Value::Array(items) => items.iter().map(entries).sum(),
        _ => 0,
    }
}

/// In JSON text that parses: how many object keys it writes (a string
/// followed by `:`), and whether every number reads back as written.
fn scan(text: &[u8]) -> (usize, bool) {
    let (mut keys, mut i) = (0, 0);
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                let mut j = i;
                while j < text.len() && text[j].is_ascii_whitespace() {
                    j += 1;
                }
                keys += usize::from(text.get(j) == Some(&b':'));
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < text.len() && matches!(text[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                }
                let token = std::str::from_utf8(&text[start..i]).unwrap_or("");
                let Ok(number) = serde_json::from_str::<serde_json::Number>(token) else { return (keys, false) };
                if number.to_string() != token {
                    return (keys, false);
                }
            }
            _ => i += 1,
        }
    }
    (keys, true)
}

#[cfg(test)]
mod tests {
    use super::from_text;

    #[test]
    fn json_text_is_canonical_where_nothing_is_lost() {
        let a = from_text(br#"{"b": [1, 2.5, {"y": null, "x": "\"q\":"}], "a": -3}"#).unwrap();
        let b = from_text(br#"{"a":-3,"b":[1,2.5,{"x":"\"q\":","y":null}]}"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, br#"{"a":-3,"b":[1,2.5,{"x":"\"q\":","y":null}]}"#);
        assert_ne!(from_text(br#"{"a":1.0}"#), from_text(br#"{"a":1}"#));
    }

    #[test]
    fn json_text_whose_parse_would_lose_a_difference_has_no_canonical_form() {
        for text in [
            &br#"{"amount":1.000000000000000001}"#[..],
            br#"{"amount":123456789012345678901234567890}"#,
            br#"{"amount":1e2}"#,
            br#"{"a":1,"a":2}"#,
            br#"{"o":{"k":1,"k":1}}"#,
            b"not json",
        ] {
            assert_eq!(from_text(text), None, "{}", String::from_utf8_lossy(text));
        }
    }
}
