//! Where a key-value store (Redis, memory) keeps each record: one name per
//! (record kind, scope, key), and no two triples share a name.
//!
//! A name is `<prefix>{<key>}<kind>:<scope>`:
//! - the prefix (a store setting) and the key have `%`, `{` and `}` written
//!   as `%25`, `%7B` and `%7D`, so the first `{` ends the prefix and the
//!   first `}` after it ends the key. The key is therefore exactly Redis
//!   Cluster's hash tag: every record of one business key (its lease
//!   record, precheck marker, lock and fencing counter) lives in one slot;
//! - the kind is a fixed word right after that `}`, where neither a scope
//!   nor a key can reach, and none of the words is the start of another
//!   (each ends at the first `:`);
//! - the scope is everything after the kind's `:`, as it is.
//!
//! So a name can be read back into its triple ([`parse`] does, for the
//! tests), which is what makes the naming injective by construction:
//! scopes and keys may hold any text, `:`, braces, backslashes and the kind
//! words included. The key is the key as stored (composite keys joined
//! with escaped parts, long keys hashed: see [`Key`](crate::Key)), and so is
//! the scope (long ones, and any starting with a backslash or holding NUL,
//! hashed).
//!
//! Records written by idem before this layout (0.1: `prefix{key}:scope`,
//! `prefix{scope:key}:lock`, `prefix token:<token>`, ...) sit at names this
//! layout never produces (no kind word follows their `}`, or no `{` follows
//! their prefix), so they are never read as records of any kind: they are
//! abandoned and expire by their TTL.

/// The kinds of record a key-value store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A lease record (`strategy = "lease"`).
    Lease,
    /// A precheck marker (`precheck = "redis"`).
    Seen,
    /// A lock (`lock+dedup`, `lock+state`, `lock`, `idem::lock::acquire`).
    Lock,
    /// A lock's fencing counter.
    Fence,
    /// A one-time token (`token`, `token+dedup`).
    Token,
    /// The recorded steps of a lease-guarded call (beside its lease record,
    /// in its Cluster slot).
    Steps,
}

impl RecordKind {
    /// Every kind.
    pub const ALL: [RecordKind; 6] = [
        RecordKind::Lease,
        RecordKind::Seen,
        RecordKind::Lock,
        RecordKind::Fence,
        RecordKind::Token,
        RecordKind::Steps,
    ];

    /// The word that names the kind in a record's name.
    pub const fn word(self) -> &'static str {
        match self {
            RecordKind::Lease => "lease",
            RecordKind::Seen => "seen",
            RecordKind::Lock => "lock",
            RecordKind::Fence => "fence",
            RecordKind::Token => "token",
            RecordKind::Steps => "steps",
        }
    }

    #[cfg(any(test, feature = "redis", feature = "etcd"))]
    fn from_word(word: &str) -> Option<RecordKind> {
        RecordKind::ALL.into_iter().find(|k| k.word() == word)
    }
}

/// The names of one store's records: its prefix, escaped once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keyspace {
    prefix: String,
}

impl Keyspace {
    /// The names under `prefix` (any text: braces in it are escaped, so
    /// they never become a hash tag).
    pub(crate) fn new(prefix: &str) -> Keyspace {
        let mut escaped = String::with_capacity(prefix.len());
        escape(prefix, &mut escaped);
        Keyspace { prefix: escaped }
    }

    /// The name of the record of `kind` for `scope` and `key` (both as stored).
    pub(crate) fn name(&self, kind: RecordKind, scope: &str, key: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + key.len() + scope.len() + 8);
        self.write(&mut out, kind, scope, key);
        out
    }

    /// Append the name to `out` (for a caller packing it with other text).
    pub(crate) fn write(&self, out: &mut String, kind: RecordKind, scope: &str, key: &str) {
        // An empty hash tag (`{}`) would make Redis hash the whole name, and
        // a lock and its counter could land in different slots. Keys are
        // never empty: `Key` and token checks refuse that first.
        debug_assert!(!key.is_empty(), "a record key is never empty");
        out.push_str(&self.prefix);
        out.push('{');
        escape(key, out);
        out.push('}');
        out.push_str(kind.word());
        out.push(':');
        out.push_str(scope);
    }
}

/// `%`, `{` and `}` written as `%25`, `%7B` and `%7D`: the result holds no
/// brace, and different texts stay different.
fn escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

#[cfg(any(test, feature = "redis", feature = "etcd"))]
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
/// Read a name of the keyspace of `prefix` back into its kind, scope and
/// key; `None` for anything that is not such a name (a record of the
/// earlier layout, another prefix's record, another application's key).
pub(crate) fn parse(prefix: &str, name: &str) -> Option<(RecordKind, String, String)> {
    Keyspace::new(prefix).read(name)
}

#[cfg(any(test, feature = "redis", feature = "etcd"))]
impl Keyspace {
    /// Read a name of this keyspace back into its kind, scope and key (both
    /// as stored); `None` for anything that is not such a name (a record of
    /// the earlier layout, another prefix's record, another application's
    /// key).
    pub(crate) fn read(&self, name: &str) -> Option<(RecordKind, String, String)> {
        let rest = name.strip_prefix(self.prefix.as_str())?.strip_prefix('{')?;
        let close = rest.find('}')?;
        let key = unescape(&rest[..close])?;
        let (word, scope) = rest[close + 1..].split_once(':')?;
        let kind = RecordKind::from_word(word)?;
        Some((kind, scope.to_owned(), key))
    }

    /// The prefix as names start with it (`%`, `{`, `}` escaped).
    pub(crate) fn escaped_prefix(&self) -> &str {
        &self.prefix
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::key::KeyBuilder;

    /// Pieces that stress the layout: its separators and escapes, the kind
    /// words, backslash escapes of key text, and text outside ASCII.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(vec![
                ":", "{", "}", "\\", "%", "%7B", "%7D", "%25", "7B", "lease", "seen", "lock", "fence", "token",
                "lease:", "}lock:", ":seen", "{x}", "a", "b", "c", " ", "\\0", "\\:", "\\sha256:", "sha256", "é", "日本",
                "\u{1F600}", "\u{202E}", "\t",
            ])
            .prop_map(str::to_owned),
            1 => "[^\u{0}]{0,6}",
            1 => Just("x".repeat(130)),
        ]
    }

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(piece(), 0..max).prop_map(|p| p.concat())
    }

    fn kind() -> impl Strategy<Value = RecordKind> {
        prop::sample::select(RecordKind::ALL.to_vec())
    }

    /// The name a guard's record gets: scope and key parts through the
    /// same steps as in a guard (stored scope, composite key text).
    fn full_name(space: &Keyspace, kind: RecordKind, scope: &str, parts: &[String]) -> Option<String> {
        let mut key = KeyBuilder::new("parts");
        for part in parts {
            key = key.part(part.as_str());
        }
        let key = key.finish("test").ok()?; // blank parts are refused before any store
        Some(space.name(kind, &crate::key::stored_scope(scope), key.as_str()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        #[test]
        fn every_name_reads_back_as_its_kind_scope_and_key(
            prefix in text(3), kind in kind(), scope in text(5), key in text(5).prop_filter("keys are never empty", |k| !k.is_empty()),
        ) {
            let name = Keyspace::new(&prefix).name(kind, &scope, &key);
            prop_assert_eq!(parse(&prefix, &name), Some((kind, scope, key)));
        }

        #[test]
        fn different_kinds_scopes_or_keys_never_share_a_name(
            prefix in text(2),
            a in (kind(), text(4), prop::collection::vec(text(3), 1..4)),
            b in (kind(), text(4), prop::collection::vec(text(3), 1..4)),
        ) {
            let space = Keyspace::new(&prefix);
            if let (Some(na), Some(nb)) = (full_name(&space, a.0, &a.1, &a.2), full_name(&space, b.0, &b.1, &b.2)) {
                prop_assert!(a == b || na != nb, "{:?} and {:?} share {:?}", a, b, na);
            }
        }

        /// The collisions of a joined layout: one text cut into scope and
        /// key parts in two different places.
        #[test]
        fn one_text_cut_in_different_places_gives_different_names(
            pieces in prop::collection::vec(piece(), 2..8), kinds in (kind(), kind()), cuts in (0usize..8, 0usize..8, 0usize..8, 0usize..8),
        ) {
            let split = |scope_end: usize, part_end: usize| {
                let scope_end = scope_end.min(pieces.len() - 1);
                let part_end = part_end.clamp(scope_end + 1, pieces.len());
                let mut parts = vec![pieces[scope_end..part_end].concat()];
                if part_end < pieces.len() {
                    parts.push(pieces[part_end..].concat());
                }
                (pieces[..scope_end].concat(), parts)
            };
            let (a, b) = (split(cuts.0, cuts.1), split(cuts.2, cuts.3));
            let space = Keyspace::new("idem:");
            if let (Some(na), Some(nb)) = (full_name(&space, kinds.0, &a.0, &a.1), full_name(&space, kinds.1, &b.0, &b.1)) {
                prop_assert!((kinds.0, &a) == (kinds.1, &b) || na != nb, "{:?} and {:?} share {:?}", a, b, na);
            }
        }
    }

    #[test]
    fn the_collisions_of_the_earlier_layout_are_gone() {
        let space = Keyspace::new("idem:");
        let key = |parts: &[&str]| {
            let mut k = KeyBuilder::new("k");
            for p in parts {
                k = k.part(*p);
            }
            k.finish("t").unwrap().as_str().to_owned()
        };
        // Lock names were `scope:key`: ("shop.a:b", "c") met ("shop.a", ("b", "c")).
        assert_ne!(
            space.name(RecordKind::Lock, "shop.a:b", &key(&["c"])),
            space.name(RecordKind::Lock, "shop.a", &key(&["b", "c"]))
        );
        // A lease record of scope `lock` sat where a lock of that key was.
        for kind in [RecordKind::Lock, RecordKind::Fence] {
            assert_ne!(space.name(RecordKind::Lease, kind.word(), "k"), space.name(kind, "s", "k"));
        }
        // A marker of scope `x` sat where a lease record of scope `x:seen` was.
        assert_ne!(space.name(RecordKind::Seen, "x", "k"), space.name(RecordKind::Lease, "x:seen", "k"));
        // The hash tag is the key whatever braces the prefix or key hold.
        let name = Keyspace::new("app{1}:").name(RecordKind::Lock, "s", "a}b{c");
        assert_eq!(name, "app%7B1%7D:{a%7Db%7Bc}lock:s");
    }

    #[test]
    fn names_of_the_earlier_layout_read_as_nothing() {
        for old in ["idem:{T1}:payments", "idem:{T1}:payments:seen", "idem:{payments:T1}:lock", "idem:token:abc"] {
            assert_eq!(parse("idem:", old), None, "{old}");
        }
    }
}
