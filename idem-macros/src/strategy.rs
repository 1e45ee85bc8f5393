//! The strategy table: one row per strategy, saying what it needs and what
//! it allows. Every rule in `validate.rs` that depends on the strategy reads
//! the strategy's row; no rule matches on strategies itself.

use Use::{Optional, Refused, Required};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Dedup,
    State,
    DedupState,
    Token,
    TokenDedup,
    LockDedup,
    LockState,
    Lease,
    Lock,
    Unique,
    UniqueState,
}

/// Whether a strategy needs an argument (or parameter), takes it, or gives
/// it no meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Required,
    Optional,
    Refused,
}

/// What the guard does in the caller's transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tx {
    Record,
    Status,
    RecordAndStatus,
    /// Nothing of the guard's: the body's own insert is the claim.
    Insert,
    /// Its insert, and the entity's status.
    InsertAndStatus,
    /// Nothing: it keeps its state in a store of its own. `instead` names
    /// the strategies that write in the transaction; `refuses_tx`, when
    /// set, says why a transaction parameter is an error (its record would
    /// say done for work the caller may still roll back).
    Outside {
        instead: &'static str,
        refuses_tx: Option<&'static str>,
    },
}

/// Whether the strategy keeps a dedup record: something to fingerprint,
/// retain and replay an answer from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Kept,
    /// None; `instead` names the strategies that keep one.
    None {
        instead: &'static str,
    },
}

/// Whether `precheck` (a marker cache in front of the record) fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precheck {
    Fits,
    Refused { why: &'static str, help: &'static str },
}

/// Which `claim = "..."` the strategy takes, and why not the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    BeforeOrAfter,
    BeforeOnly { why: &'static str },
    Refused { why: &'static str },
}

/// What a strategy needs and allows.
pub struct Spec {
    pub name: &'static str,
    pub strategy: Strategy,
    pub tx: Tx,
    pub record: Record,
    pub key: Use,
    pub transition: Use,
    /// The role of the store it uses besides the database (`store = "..."`
    /// names it; default: the one installed for that role).
    pub store: Option<&'static str>,
    /// The `#[idem(token)]` parameter.
    pub token_param: Use,
    /// An explicit `scope` (tokens are issued for one).
    pub scope: Use,
    /// The `source = "..."` values it serves.
    pub sources: &'static [&'static str],
    pub lease: Use,
    /// `ttl` as the lock's TTL (with `precheck`, every strategy it fits
    /// takes `ttl` as the marker's).
    pub ttl: Use,
    pub wait: Use,
    pub concurrency_only: Use,
    pub on_store_error: Use,
    pub precheck: Precheck,
    pub claim: Claim,
    /// `constraint` and `replay` (and `savepoint`): the body's own insert
    /// on a unique key is the claim.
    pub unique: Use,
}

/// Every `source = "..."`.
pub const SOURCES: &[&str] = &["frontend", "callback", "mq", "rpc"];
/// A one-time token is fetched with a form: only people at one send it.
const FORMS: &[&str] = &["frontend"];

const NO_RECORD: Precheck = Precheck::Refused {
    why: "it keeps no record to confirm a marker against",
    help: "use `precheck` with `dedup`, `dedup+state`, `token+dedup` or `lease`, or remove it",
};
const STATE_FIRST: Claim = Claim::BeforeOnly { why: "a state change is checked before the body runs" };
const TOKEN_FIRST: Claim = Claim::BeforeOnly { why: "a token is spent before the body runs" };
const LOCK_FIRST: Claim = Claim::BeforeOnly { why: "a lock is taken before the body runs" };
const INSERT_IS_CLAIM: Claim = Claim::Refused { why: "the body's own insert is the claim" };
const NO_MARKER: Precheck = Precheck::Refused {
    why: "it keeps no record: the business row is the record",
    help: "remove `precheck`: a repeat's insert meets the row on its unique key at the cost of one insert",
};

/// The strategy table.
#[rustfmt::skip]
pub static STRATEGIES: &[Spec] = &[
    Spec {
        name: "dedup", strategy: Strategy::Dedup,
        tx: Tx::Record, record: Record::Kept, key: Required, transition: Refused,
        store: None, token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Refused,
        precheck: Precheck::Fits, claim: Claim::BeforeOrAfter, unique: Refused,
    },
    Spec {
        name: "state", strategy: Strategy::State,
        tx: Tx::Status, record: Record::None { instead: "`dedup+state`" }, key: Required, transition: Required,
        store: None, token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Refused,
        precheck: NO_RECORD, claim: STATE_FIRST, unique: Refused,
    },
    Spec {
        name: "dedup+state", strategy: Strategy::DedupState,
        tx: Tx::RecordAndStatus, record: Record::Kept, key: Required, transition: Required,
        store: None, token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Refused,
        precheck: Precheck::Fits, claim: STATE_FIRST, unique: Refused,
    },
    Spec {
        name: "token", strategy: Strategy::Token,
        tx: Tx::Outside { instead: "`token+dedup`", refuses_tx: None }, record: Record::None { instead: "`token+dedup`" },
        key: Refused, transition: Refused,
        store: Some("token"), token_param: Required, scope: Required, sources: FORMS,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Optional,
        precheck: NO_RECORD, claim: TOKEN_FIRST, unique: Refused,
    },
    Spec {
        name: "token+dedup", strategy: Strategy::TokenDedup,
        tx: Tx::Record, record: Record::Kept, key: Required, transition: Refused,
        store: Some("token"), token_param: Required, scope: Required, sources: FORMS,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Optional,
        precheck: Precheck::Fits, claim: TOKEN_FIRST, unique: Refused,
    },
    Spec {
        name: "lock+dedup", strategy: Strategy::LockDedup,
        tx: Tx::Record, record: Record::Kept, key: Required, transition: Refused,
        store: Some("lock"), token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Required, wait: Optional, concurrency_only: Refused, on_store_error: Refused,
        precheck: Precheck::Refused {
            why: "its record is read only once the lock is held",
            help: "remove `precheck`: the lock already keeps repeats of a key in line",
        },
        claim: LOCK_FIRST, unique: Refused,
    },
    Spec {
        name: "lock+state", strategy: Strategy::LockState,
        tx: Tx::Status, record: Record::None { instead: "`lock+dedup` or `dedup+state`" },
        key: Required, transition: Required,
        store: Some("lock"), token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Required, wait: Optional, concurrency_only: Refused, on_store_error: Refused,
        precheck: NO_RECORD, claim: LOCK_FIRST, unique: Refused,
    },
    Spec {
        name: "lease", strategy: Strategy::Lease,
        tx: Tx::Outside {
            instead: "`dedup`",
            refuses_tx: Some("its record commits on its own, and would say done for a rolled-back call"),
        }, record: Record::Kept, key: Required, transition: Refused,
        store: Some("lease"), token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Optional, ttl: Refused, wait: Optional, concurrency_only: Refused, on_store_error: Refused,
        precheck: Precheck::Fits,
        claim: Claim::Refused { why: "a lease is always claimed before the body" }, unique: Refused,
    },
    Spec {
        name: "lock", strategy: Strategy::Lock,
        tx: Tx::Outside { instead: "`lock+dedup` or `lock+state`", refuses_tx: None },
        record: Record::None { instead: "`lock+dedup`" }, key: Required, transition: Refused,
        store: Some("lock"), token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Required, wait: Optional, concurrency_only: Required, on_store_error: Refused,
        precheck: NO_RECORD, claim: LOCK_FIRST, unique: Refused,
    },
    Spec {
        name: "unique", strategy: Strategy::Unique,
        tx: Tx::Insert, record: Record::None { instead: "`dedup`" }, key: Optional, transition: Refused,
        store: None, token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Refused,
        precheck: NO_MARKER, claim: INSERT_IS_CLAIM, unique: Required,
    },
    Spec {
        name: "unique+state", strategy: Strategy::UniqueState,
        tx: Tx::InsertAndStatus, record: Record::None { instead: "`dedup+state`" }, key: Required,
        transition: Required,
        store: None, token_param: Refused, scope: Optional, sources: SOURCES,
        lease: Refused, ttl: Refused, wait: Refused, concurrency_only: Refused, on_store_error: Refused,
        precheck: NO_MARKER, claim: INSERT_IS_CLAIM, unique: Required,
    },
];

impl Spec {
    /// The row of the strategy called `name` (spaces ignored: `"lock + dedup"`).
    pub fn find(name: &str) -> Option<&'static Spec> {
        let name: String = name.chars().filter(|c| !c.is_whitespace()).collect();
        STRATEGIES.iter().find(|s| s.name == name)
    }

    pub fn keeps_record(&self) -> bool {
        self.record == Record::Kept
    }
}

impl Strategy {
    pub fn spec(self) -> &'static Spec {
        STRATEGIES.iter().find(|s| s.strategy == self).expect("every strategy has a row")
    }

    pub fn moves_state(self) -> bool {
        self.spec().transition == Required
    }

    pub fn is_lock(self) -> bool {
        self.spec().store == Some("lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_strategy_and_rows_agree() {
        for s in STRATEGIES {
            assert_eq!(STRATEGIES.iter().filter(|o| o.strategy == s.strategy || o.name == s.name).count(), 1);
            assert_eq!(Spec::find(s.name).map(|f| f.strategy), Some(s.strategy));
            assert!(std::ptr::eq(s.strategy.spec(), s));
            // A transaction strategy needs no other store to hold its state, but
            // a strategy outside a transaction does.
            assert!(matches!(s.tx, Tx::Outside { .. }) <= s.store.is_some(), "{}", s.name);
            // A token is the key of `token` alone; every token strategy needs its scope.
            assert_eq!(s.token_param == Required, s.scope == Required, "{}", s.name);
            assert_eq!(s.ttl == Required, s.store == Some("lock"), "{}", s.name);
            assert!(s.precheck != Precheck::Fits || s.keeps_record(), "{}", s.name);
        }
        assert_eq!(Spec::find(" lock + dedup ").map(|s| s.strategy), Some(Strategy::LockDedup));
    }
}
