//! The text values of arguments: durations, a transition, a scope. Each
//! parser returns the value or one error of the crate's form.

use proc_macro2::Span;
use syn::Ident;

use crate::errors::error;

/// What a duration argument is for: its name, an example, its least length
/// and why, and how long it usually is (said when it is over the maximum).
pub struct DurationRule {
    pub arg: &'static str,
    pub example: &'static str,
    /// At least this many milliseconds, because of `short`.
    pub min_ms: u64,
    pub short: &'static str,
    pub usual: &'static str,
}

pub const RETENTION: DurationRule = DurationRule {
    arg: "retention",
    example: "7d",
    min_ms: 1,
    short: "",
    usual: "a record only has to outlive the retries of its request: days are usual",
};
pub const LEASE: DurationRule = DurationRule {
    arg: "lease",
    example: "30s",
    min_ms: 100,
    short: "the guard renews a lease every third of its length",
    usual: "the guard renews a lease while the body runs: seconds are usual",
};
pub const LOCK_TTL: DurationRule = DurationRule {
    arg: "ttl",
    example: "30s",
    min_ms: 100,
    short: "the guard renews its lock every third of the TTL",
    usual: "the guard renews a lock while the body runs: seconds are usual",
};
pub const MARKER_TTL: DurationRule = DurationRule {
    arg: "ttl",
    example: "24h",
    min_ms: 1,
    short: "",
    usual: "a precheck marker only has to outlive the retries of its request: hours or days are usual",
};
pub const WAIT: DurationRule = DurationRule {
    arg: "wait",
    example: "2s",
    min_ms: 1,
    short: "",
    usual: "`wait` is how long a call waits for the call that holds its key (a lease or a lock): seconds are usual",
};

/// The longest duration any argument takes: 100 years as humantime counts
/// them (`"100y"`, 365.25 days each, so `"36500d"` fits too). Every store
/// holds an expiry that far out with a wide margin: the tightest is MySQL,
/// whose `DATETIME(6)` columns end in year 9999 (now + the duration); then
/// PostgreSQL's `interval` and `timestamptz` (i64 microseconds, year 294276),
/// Redis `PX` and SQLite's epoch milliseconds (i64); the memory stores
/// saturate.
const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(100 * 31_557_600);

/// A duration argument such as `"30s"` or `"7d"`, in milliseconds: at least
/// the rule's least length, at most [`MAX_DURATION`].
pub fn parse_duration(rule: &DurationRule, text: &str, span: Span) -> syn::Result<u64> {
    let arg = rule.arg;
    let d = humantime::parse_duration(text).map_err(|e| {
        let reason = match e {
            humantime::DurationError::UnknownUnit { unit, .. } if !unit.is_empty() => {
                format!("unknown unit \"{unit}\"")
            }
            humantime::DurationError::NumberOverflow => "the number is too large".to_owned(),
            other => other.to_string(),
        };
        error(
            span,
            format!("`{arg} = \"{text}\"` is not a duration ({reason})"),
            "write e.g. \"30s\", \"15m\", \"24h\", \"7d\"",
        )
    })?;
    if d.is_zero() {
        let help = format!("give a duration longer than zero, e.g. \"{}\"", rule.example);
        return Err(error(span, format!("`{arg} = \"{text}\"` is zero"), help));
    }
    if d.as_millis() == 0 {
        let what = format!("`{arg} = \"{text}\"` is under a millisecond, the stores' resolution");
        return Err(error(span, what, "use at least \"1ms\""));
    }
    if d > MAX_DURATION {
        let what = format!("`{arg} = \"{text}\"` is longer than 100 years, the limit of every idem duration");
        return Err(error(span, what, format!("use at most \"100y\"; {}", rule.usual)));
    }
    let ms = u64::try_from(d.as_millis()).expect("100 years fit in u64 milliseconds");
    if ms < rule.min_ms {
        let what = format!("`{arg} = \"{text}\"` is too short: {}", rule.short);
        return Err(error(
            span,
            what,
            format!("use at least \"{}ms\", time for a store round trip (seconds are usual)", rule.min_ms),
        ));
    }
    Ok(ms)
}

/// `transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled"`.
pub struct TransitionArg {
    /// `OrderStatus`: the path before the variant names.
    pub enum_path: syn::Path,
    pub from: Vec<Ident>,
    pub to: Ident,
    pub span: Span,
}

const TRANSITION_FORM: &str =
    "write it as \"OrderStatus::WaitPay -> OrderStatus::Paid\", several sources joined by `|`";

/// `"A::X | A::Y -> A::Z"`: sources and target, variants of one enum.
pub fn parse_transition(text: &str, span: Span) -> syn::Result<TransitionArg> {
    let fail = |what: String| error(span, format!("`transition` {what}"), TRANSITION_FORM);
    let Some((left, right)) = text.split_once("->") else {
        return Err(fail("has no `->` between the source and the target state".to_owned()));
    };
    if right.contains("->") {
        return Err(fail("has more than one `->`: a transition has one target".to_owned()));
    }
    let (enum_path, to) = transition_state(right, span)?;
    let mut from = Vec::new();
    for part in left.split('|') {
        let (p, v) = transition_state(part, span)?;
        if quote::quote!(#p).to_string() != quote::quote!(#enum_path).to_string() {
            let (p, e) = (quote::quote!(#p), quote::quote!(#enum_path));
            return Err(fail(format!("mixes `{p}` and `{e}`: a transition moves one status enum")));
        }
        if v == to {
            let what = format!("`transition` goes from `{v}` to itself");
            let help = format!("remove `{v}` from the sources: a repeat of it could not be told from a first call");
            return Err(error(span, what, help));
        }
        if !from.contains(&v) {
            from.push(v);
        }
    }
    Ok(TransitionArg { enum_path, from, to, span })
}

/// One state of a transition, `Enum::Variant`: the enum's path and the variant.
fn transition_state(part: &str, span: Span) -> syn::Result<(syn::Path, Ident)> {
    let fail = |what: String| error(span, format!("`transition` {what}"), TRANSITION_FORM);
    let part = part.trim();
    if part.is_empty() {
        return Err(fail("is missing a state".to_owned()));
    }
    let path: syn::Path = syn::parse_str(part).map_err(|_| fail(format!("has `{part}`, which is not a path")))?;
    if path.segments.len() < 2 || path.segments.iter().any(|s| !s.arguments.is_none()) {
        let last = path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        let what = format!("`transition` names `{part}` without its enum");
        return Err(error(span, what, format!("name each state with its enum, e.g. `OrderStatus::{last}`")));
    }
    let n = path.segments.len();
    let variant = path.segments[n - 1].ident.clone();
    let prefix =
        syn::Path { leading_colon: path.leading_colon, segments: path.segments.iter().take(n - 1).cloned().collect() };
    Ok((prefix, variant))
}

/// A scope names a guard's records wherever they are kept (any text is
/// safe there: stores escape or hash it), and people read it in logs, in
/// `idem_records` and in Redis keys. An empty one names nothing, and a
/// control character (a newline, a tab, NUL) is a slip nobody could read
/// back or type in a query.
pub fn check_scope_text(scope: &str, span: Span) -> syn::Result<()> {
    let problem = if scope.trim().is_empty() {
        "is empty".to_owned()
    } else if let Some(c) = scope.chars().find(|c| c.is_control()) {
        format!("contains the control character `{}`", c.escape_default())
    } else {
        return Ok(());
    };
    Err(error(
        span,
        format!("`scope` {problem}: people read scopes in logs and queries"),
        "use letters, digits and punctuation, e.g. \"payments.on_pay\"",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let at = Span::call_site();
        assert_eq!(parse_duration(&RETENTION, "7d", at).unwrap(), 7 * 86_400_000);
        assert_eq!(parse_duration(&RETENTION, "100y", at).unwrap(), 100 * 31_557_600_000);
        for bad in ["0s", "10us", "101y", "30 parsecs", ""] {
            let e = parse_duration(&RETENTION, bad, at).unwrap_err().to_string();
            assert!(e.lines().count() == 2 && e.contains("\nhelp: "), "{e}");
        }
        assert!(parse_duration(&LEASE, "50ms", at).unwrap_err().to_string().contains("too short"));
        assert_eq!(parse_duration(&LEASE, "100ms", at).unwrap(), 100);
    }

    #[test]
    fn transitions() {
        let at = Span::call_site();
        let t = parse_transition("a::S::X | a::S::Y -> a::S::Z", at).unwrap();
        assert_eq!((t.from.len(), t.to.to_string()), (2, "Z".to_owned()));
        for bad in ["S::X => S::Y", "S::X -> S::Y -> S::Z", "X -> Y", "S::X -> S::X", "S::X | T::Y -> S::Z", " -> S::X"]
        {
            assert!(parse_transition(bad, at).is_err(), "{bad}");
        }
    }
}
