//! What a first call's answer must be to replay exactly: [`Replayable`],
//! and the checks an answer passes before it is kept (it decodes back into
//! its type, and no `Some` hides in its JSON as `null`).

mod exact;

/// The `Ok` type of a guarded function: stored after the first call and
/// returned to every repeat, so it must survive a JSON round trip. `()`, `0`,
/// `false`, `""`, empty collections and `None` all replay exactly. The first
/// call checks that its answer decodes back; a value JSON cannot carry is
/// not kept (the first call still gets it, its record says "answer not
/// kept", and repeats get [`Error::AnswerNotKept`](crate::Error::AnswerNotKept),
/// never a second run): `f64::NAN`, and a `Some` around a value JSON writes
/// as `null` (`Some(())`, `Some(None)` of an `Option<Option<T>>`,
/// `Some(Value::Null)`), which would replay as `None`; use `bool` for
/// `Option<()>` and an enum of your own for three-valued answers. Serde shapes that decode into another variant
/// (an `#[serde(untagged)]` enum whose variants overlap) are not detected.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed to a repeated call",
    label = "the first call's answer is stored and returned to every repeat",
    note = "derive `serde::Serialize` and `serde::Deserialize` on `{Self}` (or, in an `Option` or a `Vec`, on your type)"
)]
pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}
// Not recommended: rustc then reports the one missing `Replayable` (with
// the fix above) instead of one error per serde trait the impl needs.
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

/// The answer as JSON, or why it has none.
pub(crate) fn encode<T: Replayable>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string(value)
}

/// `json` as the record keeps it, once checked: at most `max` bytes (what
/// the store holds), and decoding back into `T` with no `Some` that would
/// come back as `None`. A value JSON cannot carry exactly (`f64::NAN`
/// becomes `null`, `Some(())` is written like `None`) would replay as
/// another answer than the first call's.
pub(crate) fn fit<T: Replayable>(value: &T, json: String, max: usize) -> Result<(String, T), serde_json::Error> {
    use serde::ser::Error as _;
    if json.len() > max {
        return Err(serde_json::Error::custom(format_args!(
            "its JSON is {} bytes, more than the {max} the store holds; return less (an id to look the rest up by), \
             or keep the records where answers may be larger",
            json.len()
        )));
    }
    let back = serde_json::from_str::<T>(&json)?;
    // Only JSON with a `null` in it can hide such a `Some`.
    if json.contains("null") {
        exact::check(value, &back).map_err(serde_json::Error::custom)?;
    }
    Ok((json, back))
}
