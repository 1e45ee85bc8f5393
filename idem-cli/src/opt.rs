//! The command line: flags, commands and their help (clap's derive API),
//! and what the arguments name (which stores, which record).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_runtime::Key;
use idem_runtime::admin::RecordId;
use idem_runtime::outbox::{MessageId, MessageQuery, MessageState};

use crate::error::Failure;

const EXIT_CODES: &str = "\
Exit codes:
  0  done (inspect, outbox show: also when there is no such record or
     message; the output says so)
  1  an error: a store unreachable or failing, tables missing, or a release,
     resolution or resend refused (no such record or message, not stuck, no
     such step in flight, held by a worker, taken over meanwhile, not
     confirmed)
  2  usage: bad arguments, or no store given for the command

Stores: --database-url (postgres://, postgresql://, mysql://, mariadb://,
sqlite:) and/or --redis-url (redis://, rediss://); or IDEM_DATABASE_URL and
IDEM_REDIS_URL. inspect, stuck, release and steps resolve act on each
store given; migrate, purge, outbox and relay on the database.

HTTP records (the Idempotency-Key layer, idem::http): the scope is the
layer's (default `http`); --key is the header's key without its quotes;
a layer with a tenant function keys its records by tenant, then key: give
the tenant with --tenant. Stored responses are shown as status, headers
and body.

With --json, every outcome is one JSON document on stdout, bad arguments
included ({\"error\": ..., \"exit_code\": 2}).";

/// Operate idem's records: create the schema, look a record up, list and
/// release stuck records, resolve a step in doubt, purge old ones, and the
/// outbox's messages.
#[derive(Parser, Debug)]
#[command(name = "idem", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) stores: StoreArgs,

    /// The record table, if the application names another than
    /// `idem_records` (`StoresBuilder::record_table`): `name` or `schema.name`.
    #[arg(
        long,
        env = "IDEM_RECORD_TABLE",
        global = true,
        value_name = "TABLE",
        default_value = "idem_records",
        hide_env_values = true
    )]
    pub(crate) table: String,

    /// Print one JSON document on stdout instead of text (messages still go
    /// to stderr).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The stores given. A struct of their own so that `run` can check and
/// reach them after it has moved the command out of `Cli`.
#[derive(Args, Debug)]
pub(crate) struct StoreArgs {
    /// The SQL database holding idem_records: postgres://..., mysql://...
    /// (also mariadb://...), or sqlite:path.
    #[arg(long, env = "IDEM_DATABASE_URL", global = true, value_name = "URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// The Redis server holding lease records: redis://host:port/db.
    #[arg(long, env = "IDEM_REDIS_URL", global = true, value_name = "URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    /// The key prefix of the application's RedisStore (`RedisStore::new(conn, prefix)`).
    #[arg(
        long,
        env = "IDEM_REDIS_PREFIX",
        global = true,
        value_name = "PREFIX",
        default_value = "idem:",
        hide_env_values = true
    )]
    pub(crate) redis_prefix: String,

    /// The etcd cluster holding lease records: etcd://host:port[,host:port...].
    #[cfg(feature = "etcd")]
    #[arg(long, env = "IDEM_ETCD_URL", global = true, value_name = "URL", hide_env_values = true)]
    pub(crate) etcd_url: Option<String>,

    /// The key prefix of the application's EtcdStore (`EtcdStore::prefix`).
    #[cfg(feature = "etcd")]
    #[arg(long, env = "IDEM_ETCD_PREFIX", global = true, value_name = "PREFIX", default_value = "idem/")]
    pub(crate) etcd_prefix: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create the record table (idem_records, or --table), its archive and
    /// the outbox (idem_outbox, or <TABLE>_outbox) if missing (safe to
    /// repeat, and to run from several processes). SQL only: Redis needs no
    /// schema.
    Migrate,

    /// Show one record: status, state (held with a live lease, lease
    /// passed, unfinished, done, expired), owner, fence, lease deadline,
    /// age, expiry, a preview of the stored response, the steps a lease
    /// call recorded so far (number, name, result, and the stable key it
    /// gave the outside system), and the step in flight where a mark says
    /// which. A call with no record (its last attempt failed, or stopped in
    /// doubt) shows its steps alone.
    Inspect(Target),

    /// List stuck records: PROCESSING with the lease passed (the worker
    /// died; the next call takes it over), or PROCESSING with no lease (an
    /// unfinished dedup record: repeats fail with Error::Unfinished until
    /// it is released). Records past their retention are not listed. A
    /// lease call's line says where it stopped: in which step (name and
    /// key) where a mark says which, else after which recorded step (the
    /// next one was in flight), or before its first step. On a SQL
    /// database also the outbox: how many messages are pending, failing and
    /// dead, and how long the oldest unsent one has waited (see `idem
    /// outbox list`).
    Stuck(StuckArgs),

    /// Delete one stuck record so that the next call of its key runs again
    /// (its recorded steps stay: it replays them and resumes after them).
    /// Shows the record and asks for confirmation (--yes skips it); refuses
    /// a record that is not stuck (running, done, expired), and one that a
    /// worker took over between the look and the delete.
    Release(ReleaseArgs),

    /// Delete records past their retention (and, with --older-than, older
    /// completed ones), in bounded batches; then the outbox's sent messages
    /// past their retention (their call's; with --older-than, also sent
    /// ones published longer ago). Pending, failing and dead messages are
    /// never purged. SQL only: Redis drops records by TTL.
    Purge(PurgeArgs),

    /// Operate a lease call's recorded steps.
    #[command(subcommand)]
    Steps(StepsCommand),

    /// Operate the transactional outbox (idem_outbox beside the record table,
    /// or <TABLE>_outbox): list the messages waiting, show one, hand them to
    /// the relay again. SQL only: the outbox lives in the database.
    #[command(subcommand)]
    Outbox(OutboxCommand),

    /// Run the outbox's relay, as a sidecar of a service that does not run
    /// one itself: hand the messages committed in the database's outbox to
    /// RabbitMQ (--amqp-url) or NATS JetStream (--nats-url), each to the
    /// broker's confirmation, then mark them sent; retry a failed one with
    /// backoff, dead-letter one the broker refuses. Several relays (this
    /// command, or services' own) share the work safely. Runs until
    /// SIGINT/SIGTERM (the round in progress finishes, its messages marked),
    /// or with --once until nothing is due. Logs warnings to stderr.
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    Relay(RelayArgs),
}

/// The arguments of `idem relay`.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("broker").required(true).args(["amqp_url", "nats_url"]))]
pub(crate) struct RelayArgs {
    /// RabbitMQ: amqp://user:password@host:port/vhost. Publisher confirms,
    /// mandatory, persistent; the message id as AMQP message_id.
    #[cfg(feature = "rabbitmq")]
    #[arg(long, env = "IDEM_AMQP_URL", value_name = "URL", hide_env_values = true)]
    pub(crate) amqp_url: Option<String>,
    /// RabbitMQ: the exchange to publish to, each message's topic the routing
    /// key (default: the default exchange, which routes to the queue named
    /// as the topic).
    #[cfg(feature = "rabbitmq")]
    #[arg(long, requires = "amqp_url", value_name = "EXCHANGE")]
    pub(crate) exchange: Option<String>,
    /// NATS JetStream: nats://host:port. The message id as Nats-Msg-Id (the
    /// stream's duplicate window drops a re-send); each message's topic the
    /// subject, after --subject-prefix.
    #[cfg(feature = "nats")]
    #[arg(long, env = "IDEM_NATS_URL", value_name = "URL", hide_env_values = true)]
    pub(crate) nats_url: Option<String>,
    /// NATS: put this before each message's topic to make its subject.
    #[cfg(feature = "nats")]
    #[arg(long, requires = "nats_url", value_name = "PREFIX")]
    pub(crate) subject_prefix: Option<String>,
    /// Relay only this scope's messages, as the guard names it (repeat it
    /// for more; none: every scope's).
    #[arg(long = "scope", value_name = "SCOPE")]
    pub(crate) scopes: Vec<String>,
    /// Messages claimed a round.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch_size: u32,
    /// How often an idle relay looks (on PostgreSQL a commit wakes it sooner).
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_pause)]
    pub(crate) poll_interval: Duration,
    /// Tries before a message is dead-lettered.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,
    /// How long a claim keeps a message from other relays, and how long the
    /// broker may take to confirm one.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) claim_lease: Duration,
    /// Relay what is due now, then exit (what was sent, retried and
    /// dead-lettered is printed; exit code 1 if any was dead-lettered).
    #[arg(long)]
    pub(crate) once: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum OutboxCommand {
    /// List messages oldest first: by default the pending (waiting for the
    /// relay), failing (the broker failed them; tried again after a backoff)
    /// and dead ones (given up: refused by the broker, or failed too often;
    /// they wait for `idem outbox resend`). A line a message: id, scope, key,
    /// topic, state, tries, age, next try, last error (cut short; --json has
    /// it whole).
    List(OutboxListArgs),

    /// Show one message: its fields, headers and payload (as text when it is
    /// UTF-8 text, else in hex; --json: as text or base64).
    Show(OutboxShowArgs),

    /// Hand messages to the relay again: pending, due now, their tries
    /// counted from 0 (their last error kept until the next try). Dead ones
    /// once their cause is fixed; failing ones without waiting for their
    /// backoff; sent ones too (harmless: the id is the same, and a consumer
    /// that deduplicates by it takes a message once). A message a relay
    /// holds right now is left to it (its outcome comes). One message by id,
    /// or with --all every message of --state (and --scope), which asks for
    /// confirmation first (--yes skips it).
    Resend(OutboxResendArgs),
}

impl OutboxCommand {
    /// What clap cannot say: `--state` and `--scope` go with `resend --all`,
    /// not with an id.
    pub(crate) fn check(&self) -> Result<(), Failure> {
        if let OutboxCommand::Resend(OutboxResendArgs { id: Some(_), filter, .. }) = self
            && (!filter.state.is_empty() || filter.scope.is_some())
        {
            return Err(Failure::usage(
                "--state and --scope choose the messages of --all: give either a message id or --all",
            ));
        }
        Ok(())
    }
}

/// A message's state, as `--state` names it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StateArg {
    Pending,
    Failing,
    Dead,
    Sent,
}

impl StateArg {
    pub(crate) fn state(self) -> MessageState {
        match self {
            StateArg::Pending => MessageState::Pending,
            StateArg::Failing => MessageState::Failing,
            StateArg::Dead => MessageState::Dead,
            StateArg::Sent => MessageState::Sent,
        }
    }
}

/// Which messages (`list`, `resend --all`).
#[derive(Args, Debug)]
pub(crate) struct MessageFilter {
    /// Messages in these states, comma-separated [default: pending,failing,dead]
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STATE")]
    pub(crate) state: Vec<StateArg>,
    /// Only this scope, as the guard names it.
    #[arg(long)]
    pub(crate) scope: Option<String>,
}

impl MessageFilter {
    /// The runtime's query of these messages, at most `limit` of them.
    pub(crate) fn query(&self, limit: u32) -> MessageQuery {
        let mut query = MessageQuery { scope: self.scope.clone(), limit, ..MessageQuery::default() };
        if !self.state.is_empty() {
            query.states = self.state.iter().map(|s| s.state()).collect();
        }
        query
    }
}

/// The arguments of `idem outbox list`.
#[derive(Args, Debug)]
pub(crate) struct OutboxListArgs {
    #[command(flatten)]
    pub(crate) filter: MessageFilter,
    /// List at most this many messages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) limit: u32,
}

/// The arguments of `idem outbox show`.
#[derive(Args, Debug)]
pub(crate) struct OutboxShowArgs {
    /// The message's id, as `idem outbox list` shows it and a consumer gets
    /// it (AMQP message_id, NATS Nats-Msg-Id): idem-msg- and 32 hex digits.
    #[arg(value_name = "MESSAGE_ID", value_parser = parse_message_id)]
    pub(crate) id: MessageId,
}

/// The arguments of `idem outbox resend`.
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
pub(crate) struct OutboxResendArgs {
    /// The message's id (see `idem outbox show`).
    #[arg(value_name = "MESSAGE_ID", value_parser = parse_message_id)]
    pub(crate) id: Option<MessageId>,
    /// Every message of --state (default: pending, failing and dead) and
    /// --scope, instead of one.
    #[arg(long, conflicts_with = "id")]
    pub(crate) all: bool,
    #[command(flatten)]
    pub(crate) filter: MessageFilter,
    /// Resend all without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum StepsCommand {
    /// Say what became of a step in flight (a step with a check, or
    /// at-most-once, that was marked started and not recorded when its
    /// attempt stopped), once the outside system has been asked about its
    /// key: --done with the step's result (recorded: the call resumes after
    /// it), or --not-done (its mark removed: the call runs it). The call of
    /// an at-most-once step stops "in doubt" until this is done. Shows the
    /// call's steps and asks for confirmation (--yes skips it); refuses
    /// while a worker holds the call with a live lease, and when no step of
    /// that name is in flight.
    Resolve(ResolveArgs),
}

/// The arguments of `idem steps resolve`.
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("outcome").required(true).args(["done", "not_done"]))]
pub(crate) struct ResolveArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// The step's name, as `idem inspect` shows it in flight.
    #[arg(long, value_name = "NAME")]
    pub(crate) step: String,
    /// The step's work was done: record --result as its result.
    #[arg(long, requires = "result")]
    pub(crate) done: bool,
    /// The step's result, as JSON of the step's `Ok` value (what the body
    /// reads back: `"ch_42"`, `500`, `{"id": 7}`), as the outside system
    /// reports it.
    #[arg(long, value_name = "JSON", value_parser = parse_json, allow_hyphen_values = true)]
    pub(crate) result: Option<String>,
    /// The step's work was not done: remove its mark, so the call runs it.
    #[arg(long, conflicts_with = "result")]
    pub(crate) not_done: bool,
    /// Resolve without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

/// The arguments of `idem stuck`. (A command's help is its variant's
/// doc comment: clap shows that, not these.)
#[derive(Args, Debug)]
pub(crate) struct StuckArgs {
    /// Only this scope, as the guard names it.
    #[arg(long)]
    pub(crate) scope: Option<String>,
    /// List at most this many records per store.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) limit: u32,
}

/// The arguments of `idem release`.
#[derive(Args, Debug)]
pub(crate) struct ReleaseArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Release without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

/// The arguments of `idem purge`.
#[derive(Args, Debug)]
pub(crate) struct PurgeArgs {
    /// Only this scope, as the guard names it.
    #[arg(long)]
    pub(crate) scope: Option<String>,
    /// Also delete records written longer ago than this (e.g. 30d, 12h),
    /// whatever their retention; PROCESSING records are never deleted
    /// this way (see `idem stuck` and `idem release`).
    // Hyphen values reach the parser, which says that a duration is
    // never negative (clap alone would call `-5d` an unknown flag).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) older_than: Option<Duration>,
    /// Copy completed records into idem_records_archive before deleting
    /// them.
    #[arg(long)]
    pub(crate) archive: bool,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Records deleted per statement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch_size: u32,
    /// Pause between batches (e.g. 10ms), to leave room for live traffic.
    #[arg(long, value_name = "DURATION", value_parser = parse_pause, allow_hyphen_values = true)]
    pub(crate) pause: Option<Duration>,
    /// After each batch, also pause N times as long as the batch took (4:
    /// deleting at most a fifth of the time, however fast the server is).
    #[arg(long, default_value_t = 0, value_name = "N", allow_hyphen_values = true)]
    pub(crate) pause_factor: u32,
}

/// Which record.
#[derive(Args, Debug)]
pub(crate) struct Target {
    /// The guard's scope (its `scope = "..."`, or `module::function`; for
    /// the HTTP layer its `.scope(...)`, default `http`).
    #[arg(long)]
    scope: String,
    /// The business key as the guard was given it (`key = "order.id"`: the
    /// id's value; for the HTTP layer the Idempotency-Key header's value
    /// without its quotes); idem derives the stored key as the guard does
    /// (escaping, hashing of keys over 128 bytes).
    #[arg(long)]
    key: String,
    /// The tenant, for a record of the HTTP layer with a tenant function
    /// (`IdempotencyLayer::tenant`): such a layer keys its records by the
    /// tenant its function named, then the header's key (a composite key,
    /// `Guard::new(scope).key(tenant).key(key)`).
    #[arg(long, conflicts_with = "stored")]
    tenant: Option<String>,
    /// --scope and --key are as stored, exactly as `idem stuck` lists them
    /// (a composite key's joined parts, a hashed `\sha256:...` key or scope).
    #[arg(long)]
    stored: bool,
}

impl StoreArgs {
    /// The database, for a command that acts on it alone (migrate, purge).
    pub(crate) fn database_url(&self) -> Result<&str, Failure> {
        if let Some(url) = &self.database_url {
            return Ok(url);
        }
        let why = if self.redis_url.is_some() { " (Redis needs no schema and drops records by TTL)" } else { "" };
        Err(Failure::usage(format!("no SQL database given: pass --database-url URL (or set IDEM_DATABASE_URL){why}")))
    }

    /// The database, for `idem outbox`: the outbox is a table beside the
    /// records, never in Redis.
    pub(crate) fn outbox_database_url(&self) -> Result<&str, Failure> {
        if let Some(url) = &self.database_url {
            return Ok(url);
        }
        let redis = if self.redis_url.is_some() { ", not in Redis" } else { "" };
        Err(Failure::usage(format!(
            "the outbox lives in the SQL database beside the records{redis}: pass --database-url URL (or set \
             IDEM_DATABASE_URL)"
        )))
    }

    /// That some store is given, for a command that acts on each.
    pub(crate) fn any(&self) -> Result<(), Failure> {
        #[cfg(feature = "etcd")]
        let etcd = self.etcd_url.is_some();
        #[cfg(not(feature = "etcd"))]
        let etcd = false;
        if self.database_url.is_none() && self.redis_url.is_none() && !etcd {
            return Err(Failure::usage(
                "no store given: pass --database-url URL and/or --redis-url URL (or set IDEM_DATABASE_URL / \
                 IDEM_REDIS_URL; with etcd, --etcd-url etcd://host:port or IDEM_ETCD_URL)",
            ));
        }
        Ok(())
    }
}

impl Target {
    pub(crate) fn id(&self) -> Result<RecordId, Failure> {
        if self.stored {
            return Ok(RecordId::stored(self.scope.clone(), self.key.clone()));
        }
        let key = Key::new(self.key.as_str()).map_err(|e| bad_part("--key", &self.key, e))?;
        let key = match &self.tenant {
            None => key,
            Some(tenant) => {
                Key::new(tenant.as_str()).map_err(|e| bad_part("--tenant", tenant, e))?;
                Key::from_parts(&[tenant, &self.key]).map_err(|e| bad_part("--key", &self.key, e))?
            }
        };
        Ok(RecordId::new(&self.scope, &key))
    }
}

/// `flag`'s value is no key (part): say which and why.
fn bad_part(flag: &str, value: &str, e: idem_runtime::Error) -> Failure {
    match e {
        idem_runtime::Error::InvalidKey { reason, .. } => {
            let reason = reason.strip_prefix("the key ").unwrap_or(&reason);
            Failure::usage(format!("{flag} {value:?} {reason}"))
        }
        e => Failure::usage(format!("{flag} {value:?}: {e}")),
    }
}

/// A length of time back from now (--older-than). clap names the flag and
/// the value in front of the message.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Some(magnitude) = text.trim_start().strip_prefix('-') {
        return Err(format!(
            "a duration cannot be negative: it counts back from now (write {magnitude} for records written \
             longer ago than that)"
        ));
    }
    let d = humantime::parse_duration(text).map_err(|e| format!("{e} (write e.g. 30d, 12h, 90min)"))?;
    if d.is_zero() { Err("give a duration above zero".to_owned()) } else { Ok(d) }
}

/// A message id: clap names the argument and the value in front of what
/// is wrong with it.
fn parse_message_id(text: &str) -> Result<MessageId, String> {
    text.parse::<MessageId>().map_err(|e| e.to_string())
}

/// `--result`: one JSON value, kept as it was written.
fn parse_json(text: &str) -> Result<String, String> {
    serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| format!("not JSON: {e} (a string is quoted: '\"ch_42\"')"))?;
    Ok(text.to_owned())
}

/// `--pause`: a duration, zero included (no pause).
fn parse_pause(text: &str) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err("a pause cannot be negative (write e.g. 10ms)".to_owned());
    }
    humantime::parse_duration(text).map_err(|e| format!("{e} (write e.g. 10ms, 1s)"))
}
