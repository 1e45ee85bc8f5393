//! `idem`: operate idem's records from a shell. Every command is a call of
//! the runtime's public functions (`idem::migrate`, `idem::admin::*`,
//! `idem::sql::purge_expired`, `RedisStore::inspect_lease`,
//! `LeaseStore::resolve_step`, `idem::outbox::*` ...), so a program can do
//! the same.
//!
//! The command line is in `opt`; each command in the module of its name,
//! acting on the stores `connect` reaches (`store`); how records look is
//! in `render`; why a command failed, and how that is told, in `error`.

use std::process::ExitCode;

use clap::Parser;

mod answer;
mod connect;
mod error;
mod inspect;
mod migrate;
mod opt;
mod outbox;
mod purge;
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
mod relay;
mod release;
mod render;
mod resolve;
mod store;
mod stuck;

use error::{Failure, argument_error};
use opt::{Cli, Command, StepsCommand};
use render::{Done, Out};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return argument_error(e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(Done { document, failure }) => {
            if json {
                println!("{document}");
            }
            failure.map_or(ExitCode::SUCCESS, Failure::exit)
        }
        Err(f) => {
            if json {
                println!("{}", f.to_json());
            }
            f.exit()
        }
    }
}

async fn run(cli: Cli) -> Result<Done, Failure> {
    let out = Out { json: cli.json };
    let Cli { stores: given, table, command, .. } = cli;
    // In each arm the same order of checks: the stores given, the table,
    // the record; only then are the stores reached.
    match command {
        Command::Migrate => {
            let url = given.database_url()?;
            use_table(&table)?;
            migrate::run(&connect::sql(url, true).await?, &out).await
        }
        Command::Inspect(target) => {
            given.any()?;
            use_table(&table)?;
            let id = target.id()?;
            inspect::run(&connect::each(&given).await?, &id, &out).await
        }
        Command::Stuck(args) => {
            given.any()?;
            use_table(&table)?;
            stuck::run(&connect::each(&given).await?, &args, &out).await
        }
        Command::Release(args) => {
            given.any()?;
            use_table(&table)?;
            let id = args.target.id()?;
            release::run(&connect::each(&given).await?, &id, args.yes, &out).await
        }
        Command::Steps(StepsCommand::Resolve(args)) => {
            given.any()?;
            use_table(&table)?;
            let id = args.target.id()?;
            resolve::run(&connect::each(&given).await?, &id, &args, &out).await
        }
        Command::Purge(args) => {
            let url = given.database_url()?;
            use_table(&table)?;
            purge::run(&connect::sql(url, false).await?, args, &out).await
        }
        Command::Outbox(command) => {
            let url = given.outbox_database_url()?;
            use_table(&table)?;
            command.check()?;
            outbox::run(&connect::sql(url, false).await?, command, &out).await
        }
        #[cfg(any(feature = "rabbitmq", feature = "nats"))]
        Command::Relay(args) => {
            let url = given.outbox_database_url()?;
            use_table(&table)?;
            relay::run(&connect::sql(url, false).await?, &args, &out).await
        }
    }
}

/// The record table the application names (`--table`), for every SQL step
/// of this run: installed as the application installs it.
fn use_table(table: &str) -> Result<(), Failure> {
    let usage = |e: idem_runtime::Error| Failure::usage(e.to_string());
    let table = idem_runtime::sql::RecordTable::new(table).map_err(usage)?;
    idem_runtime::Stores::builder().record_table(table).install().map_err(usage)?;
    Ok(())
}
