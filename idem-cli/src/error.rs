//! Why a command failed, its exit code, and how a failure is told: on
//! stderr, and with `--json` also as the JSON document on stdout.

use std::process::ExitCode;

use serde_json::{Value, json};

/// Why a command failed, and its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn error(message: impl Into<String>) -> Failure {
        Failure { code: 1, message: message.into() }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure { code: 2, message: message.into() }
    }

    /// The JSON document of a command that failed before it produced one.
    pub(crate) fn to_json(&self) -> Value {
        json!({ "error": self.message, "exit_code": self.code })
    }

    /// Say why on stderr; the exit code.
    pub(crate) fn exit(self) -> ExitCode {
        eprintln!("error: {}", self.message);
        ExitCode::from(self.code)
    }
}

/// An idem error from `store`, with what to do about it.
pub(crate) fn store_failure(store: &str, e: idem_runtime::Error) -> Failure {
    match e {
        idem_runtime::Error::NotMigrated { source, .. } => Failure::error(format!(
            "{store}: the idem tables are missing ({source}): run `idem migrate` with the same --database-url"
        )),
        e => Failure::error(format!("{store}: {e}")),
    }
}

/// Bad arguments, as clap says them on stderr, and with `--json` also as the
/// JSON document on stdout: a script reading stdout gets one whatever went
/// wrong. `--help` and `--version` are no error.
pub(crate) fn argument_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    // Whether --json was given: the parse failed, so look at the words (up
    // to a `--`, after which everything is a value).
    let json = std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    if json {
        println!("{}", json!({ "error": argument_message(&e), "exit_code": e.exit_code() }));
    }
    let _ = e.print();
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// clap's error in one line, for the JSON document.
fn argument_message(e: &clap::Error) -> String {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            "no command given: migrate, inspect, stuck, release, steps, purge or outbox (see idem --help)".to_owned()
        }
        // clap's message up to its first blank line (the required arguments
        // missing are listed on lines of their own); the rest is usage and a
        // hint to --help.
        _ => {
            let text = e.to_string();
            let lines: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let message = lines.join(" ");
            message.strip_prefix("error: ").unwrap_or(&message).to_owned()
        }
    }
}
