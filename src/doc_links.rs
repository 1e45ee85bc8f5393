//! Link definitions that docs naming items of a feature append
//! (`[text][label]` links, `#[doc = links!()]` below the docs): the items
//! where the feature compiles them, else their page on docs.rs (see the
//! runtime's `doc_links`).

use idem_runtime::__doc_link_group as group;

/// Every group's definitions, after a blank line.
macro_rules! links {
    () => {
        concat!(
            "\n\n",
            $crate::doc_links::tx_links!(),
            $crate::doc_links::sql_links!(),
            $crate::doc_links::admin_links!(),
            $crate::doc_links::redis_links!(),
            $crate::doc_links::rabbitmq_links!(),
            $crate::doc_links::nats_links!(),
            $crate::doc_links::consumer_links!(),
            $crate::doc_links::etcd_links!()
        )
    };
}
pub(crate) use links;

group!(
    feature = "tx",
    tx_links,
    ("Tx", "crate::Tx", "struct.Tx.html"),
    ("Tx::commit", "crate::Tx::commit", "struct.Tx.html#method.commit"),
    ("Tx::open", "crate::Tx::open", "struct.Tx.html#method.open"),
    ("begin", "crate::begin", "fn.begin.html"),
);

group!(
    feature = "sql",
    sql_links,
    ("crate::sql", "crate::sql", "sql/index.html"),
    (
        "crate::sql#claiming-after-the-body",
        "crate::sql#claiming-after-the-body",
        "sql/index.html#claiming-after-the-body"
    ),
    (
        "crate::sql#writing-once-with-commit",
        "crate::sql#writing-once-with-commit",
        "sql/index.html#writing-once-with-commit"
    ),
    ("crate::sql#operating", "crate::sql#operating", "sql/index.html#operating"),
    ("crate::sql#sharded-databases", "crate::sql#sharded-databases", "sql/index.html#sharded-databases"),
    ("crate::sql::TxContext", "crate::sql::TxContext", "sql/trait.TxContext.html"),
    ("crate::sql::find_record", "crate::sql::find_record", "sql/fn.find_record.html"),
    ("crate::sql::purge_expired", "crate::sql::purge_expired", "sql/fn.purge_expired.html"),
    ("crate::unique", "crate::unique", "unique/index.html"),
    ("crate::lease::Steps::run_tx", "crate::lease::Steps::run_tx", "lease/struct.Steps.html#method.run_tx"),
    ("crate::store::SqlStore", "crate::store::SqlStore", "store/struct.SqlStore.html"),
);

group!(
    any(feature = "sql", feature = "redis", feature = "etcd"),
    admin_links,
    ("crate::admin::Record::steps", "crate::admin::Record::steps", "admin/struct.Record.html#structfield.steps"),
    (
        "crate::admin::Record::in_flight",
        "crate::admin::Record::in_flight",
        "admin/struct.Record.html#structfield.in_flight"
    ),
    ("crate::admin::RecordId::new", "crate::admin::RecordId::new", "admin/struct.RecordId.html#method.new"),
    ("crate::admin::RecordId::stored", "crate::admin::RecordId::stored", "admin/struct.RecordId.html#method.stored"),
);

group!(
    feature = "redis",
    redis_links,
    ("crate::store::RedisStore", "crate::store::RedisStore", "store/struct.RedisStore.html"),
    ("crate::store::RedisStore::key", "crate::store::RedisStore::key", "store/struct.RedisStore.html#method.key"),
);

group!(
    feature = "rabbitmq",
    rabbitmq_links,
    ("crate::outbox::RabbitMq", "crate::outbox::RabbitMq", "outbox/struct.RabbitMq.html"),
    (
        "crate::outbox::RabbitMq::connect",
        "crate::outbox::RabbitMq::connect",
        "outbox/struct.RabbitMq.html#method.connect"
    ),
    (
        "crate::outbox::RabbitMq::from_channel",
        "crate::outbox::RabbitMq::from_channel",
        "outbox/struct.RabbitMq.html#method.from_channel"
    ),
    (
        "crate::outbox::RabbitMq::exchange",
        "crate::outbox::RabbitMq::exchange",
        "outbox/struct.RabbitMq.html#method.exchange"
    ),
    (
        "crate::outbox::RabbitMq::confirm_timeout",
        "crate::outbox::RabbitMq::confirm_timeout",
        "outbox/struct.RabbitMq.html#method.confirm_timeout"
    ),
);

group!(
    feature = "nats",
    nats_links,
    ("crate::outbox::JetStream", "crate::outbox::JetStream", "outbox/struct.JetStream.html"),
    (
        "crate::outbox::JetStream::connect",
        "crate::outbox::JetStream::connect",
        "outbox/struct.JetStream.html#method.connect"
    ),
    (
        "crate::outbox::JetStream::subject_prefix",
        "crate::outbox::JetStream::subject_prefix",
        "outbox/struct.JetStream.html#method.subject_prefix"
    ),
    (
        "crate::outbox::JetStream::ack_timeout",
        "crate::outbox::JetStream::ack_timeout",
        "outbox/struct.JetStream.html#method.ack_timeout"
    ),
    (
        "crate::outbox::JetStream::ensure_stream",
        "crate::outbox::JetStream::ensure_stream",
        "outbox/struct.JetStream.html#method.ensure_stream"
    ),
);

group!(
    any(feature = "rabbitmq", feature = "nats"),
    consumer_links,
    ("crate::outbox::consumer", "crate::outbox::consumer", "outbox/consumer/index.html"),
    (
        "crate::outbox::consumer::message_id",
        "crate::outbox::consumer::message_id",
        "outbox/consumer/fn.message_id.html"
    ),
    ("crate::Error::NoMessageId", "crate::Error::NoMessageId", "enum.Error.html#variant.NoMessageId"),
);

group!(
    feature = "etcd",
    etcd_links,
    ("crate::store::EtcdStore", "crate::store::EtcdStore", "store/struct.EtcdStore.html"),
);
