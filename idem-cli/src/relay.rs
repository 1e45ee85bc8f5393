//! `idem relay`: the outbox's relay as a sidecar. The runtime's
//! [`Relay`] on the database given, handing messages to the broker named
//! (RabbitMQ or NATS JetStream), until a signal stops it or, with
//! `--once`, until nothing is due.

use std::sync::Arc;

use idem_runtime::outbox::{PublishError, Publisher, Relay, RelayReport};
use idem_runtime::sql::SqlBackend;
use serde_json::json;

use crate::connect::redact;
use crate::error::Failure;
use crate::opt::RelayArgs;
use crate::render::{Done, Out};
use crate::store::Sql;

pub(crate) async fn run(sql: &Sql, args: &RelayArgs, out: &Out) -> Result<Done, Failure> {
    let (publisher, broker) = publisher(args).await?;
    match sql {
        Sql::Postgres(pool) => relay(pool, sql.name(), publisher, &broker, args, out).await,
        Sql::Mysql(pool) => relay(pool, sql.name(), publisher, &broker, args, out).await,
        Sql::Sqlite(pool) => relay(pool, sql.name(), publisher, &broker, args, out).await,
    }
}

/// The broker's publisher, and how the output names the broker (its URL
/// without a password).
async fn publisher(args: &RelayArgs) -> Result<(Arc<dyn Publisher>, String), Failure> {
    let unreachable =
        |url: &str, e: PublishError| Failure::error(format!("cannot connect to {}: {}", redact(url), e.message()));
    #[cfg(feature = "rabbitmq")]
    if let Some(url) = &args.amqp_url {
        let mut rabbit = idem_runtime::outbox::RabbitMq::connect(url).await.map_err(|e| unreachable(url, e))?;
        if let Some(exchange) = &args.exchange {
            rabbit = rabbit.exchange(exchange.as_str());
        }
        return Ok((Arc::new(rabbit), redact(url)));
    }
    #[cfg(feature = "nats")]
    if let Some(url) = &args.nats_url {
        let mut nats = idem_runtime::outbox::JetStream::connect(url).await.map_err(|e| unreachable(url, e))?;
        if let Some(prefix) = &args.subject_prefix {
            nats = nats.subject_prefix(prefix.as_str());
        }
        return Ok((Arc::new(nats), redact(url)));
    }
    // clap requires one of the brokers.
    let _ = unreachable;
    Err(Failure::usage("no broker given: pass --amqp-url URL or --nats-url URL"))
}

async fn relay<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    store: &str,
    publisher: Arc<dyn Publisher>,
    broker: &str,
    args: &RelayArgs,
    out: &Out,
) -> Result<Done, Failure> {
    let mut relay = Relay::new(pool.clone(), publisher)
        .batch_size(args.batch_size)
        .poll_interval(args.poll_interval)
        .max_attempts(args.max_attempts)
        .claim_lease(args.claim_lease);
    for scope in &args.scopes {
        relay = relay.scope(scope);
    }
    let table = idem_runtime::Stores::installed().map(|s| s.record_table().outbox().to_owned()).unwrap_or_default();
    let report = if args.once {
        relay.drain().await.map_err(|e| Failure::error(format!("{store}: the relay stopped: {e}")))?
    } else {
        // The runtime's warnings (a dead-lettered message, a round that
        // failed) on stderr, as a sidecar's log.
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .try_init();
        eprintln!("relaying {store}'s {table} to {broker} until stopped (SIGINT, SIGTERM)");
        let handle = relay.start();
        stopped().await;
        eprintln!("stopping after the round in progress");
        let report = handle.report();
        handle.stop().await;
        report
    };
    let RelayReport { claimed, sent, retried, dead, released, .. } = report;
    out.say(format_args!(
        "{store}: {sent} sent to {broker}, {retried} to try again, {dead} dead-lettered, {released} handed back \
         ({claimed} claimed)"
    ));
    let document = json!({
        "command": "relay", "store": store, "table": table, "broker": broker,
        "claimed": claimed, "sent": sent, "retried": retried, "dead": dead, "released": released,
    });
    if args.once && dead > 0 {
        let failure = Failure::error(format!(
            "{dead} message(s) dead-lettered: `idem outbox list --state dead` shows why, `idem outbox resend` \
             hands them back once fixed"
        ));
        return Ok(Done { document, failure: Some(failure) });
    }
    Ok(Done::ok(document))
}

/// SIGINT, or SIGTERM where there is one.
async fn stopped() {
    #[cfg(unix)]
    {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
