//! Link definitions that docs naming items of a feature append
//! (`[text][label]` links, `#[doc = links!()]` below the docs): the items
//! where the feature compiles them, else their page on docs.rs, which is
//! built with every feature (the facade's pages: those are the ones users
//! read). The facade defines its own groups with the same macro.

/// The page of `path` on docs.rs, this version. Not a stable API.
#[doc(hidden)]
#[macro_export]
macro_rules! __docs_rs {
    ($path:literal) => {
        concat!("https://docs.rs/idem-guard/", env!("CARGO_PKG_VERSION"), "/idem/", $path)
    };
}

/// `$name!()`: the definitions of `(label, item, page on docs.rs)`, to the
/// item where `$feature` holds in the crate that calls it, else to the
/// page. Not a stable API.
#[doc(hidden)]
#[macro_export]
macro_rules! __doc_link_group {
    ($feature:meta, $name:ident, $(($label:literal, $item:literal, $page:literal)),+ $(,)?) => {
        #[cfg($feature)]
        macro_rules! $name {
            () => {
                concat!($("[", $label, "]: ", $item, "\n"),+)
            };
        }
        #[cfg(not($feature))]
        macro_rules! $name {
            () => {
                concat!($("[", $label, "]: ", $crate::__docs_rs!($page), "\n"),+)
            };
        }
        pub(crate) use $name;
    };
}

/// Every group's definitions, after a blank line.
macro_rules! links {
    () => {
        concat!(
            "\n\n",
            $crate::doc_links::tx_links!(),
            $crate::doc_links::sql_links!(),
            $crate::doc_links::redis_links!(),
            $crate::doc_links::etcd_links!()
        )
    };
}

__doc_link_group!(
    feature = "tx",
    tx_links,
    ("Tx", "crate::Tx", "struct.Tx.html"),
    ("begin_with", "crate::sql::begin_with", "sql/fn.begin_with.html"),
);

__doc_link_group!(
    feature = "sql",
    sql_links,
    (
        "crate::StoresBuilder::record_table",
        "crate::StoresBuilder::record_table",
        "struct.StoresBuilder.html#method.record_table"
    ),
    ("crate::Ticket::complete", "crate::Ticket::complete", "struct.Ticket.html#method.complete"),
    ("crate::Guard::state", "crate::Guard::state", "struct.Guard.html#method.state"),
    ("crate::Guard::dedup_state", "crate::Guard::dedup_state", "struct.Guard.html#method.dedup_state"),
    ("crate::store::SqlStore", "crate::store::SqlStore", "store/struct.SqlStore.html"),
);

__doc_link_group!(
    feature = "redis",
    redis_links,
    ("crate::store::RedisStore", "crate::store::RedisStore", "store/struct.RedisStore.html"),
);

__doc_link_group!(
    feature = "etcd",
    etcd_links,
    ("crate::store::EtcdStore", "crate::store::EtcdStore", "store/struct.EtcdStore.html"),
);
