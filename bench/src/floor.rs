//! `vs_floor` and `floor_ratio` of `--scenario dedup`: the `one_write` mode
//! against a C client sending the same statements, and that client sending
//! `one_write`'s statements against it sending the unguarded transaction,
//! run by loadgen as two more slices of each round, so that all see the same
//! server, the same tables and the same drift. `vs_floor`: what is left
//! between `one_write` and the C client is the client's (sqlx, Tokio, the
//! pool and idem). `floor_ratio`: what the server allows `ratio_one_write`,
//! the record's insert priced by a client that costs nothing.
//!
//! The C clients: on PostgreSQL `pgbench` (`bench/pgbench/one_write.sql`,
//! `unguarded.sql`: the very texts and prepared statements loadgen sends);
//! on MariaDB `mariadb-slap` or `mysqlslap` (`bench/slap/`: the same
//! statements, prepared once per connection by a compound statement, and
//! executed as `EXECUTE ... USING`).
//!
//! `--scenario outbox` runs the same clients with another pair of scripts
//! ([`Pair::Outbox`]): the dedup guard with one outbox message
//! (`outbox.sql`) against the guard alone (`guard.sql`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::BoxError;

/// The scripts, written to temporary files for the client's `-f` / `--query`
/// (loadgen need not run from the source tree).
const PG_ONE_WRITE: &str = include_str!("../pgbench/one_write.sql");
const PG_UNGUARDED: &str = include_str!("../pgbench/unguarded.sql");
const SLAP_ONE_WRITE: &str = include_str!("../slap/one_write.sql");
const SLAP_UNGUARDED: &str = include_str!("../slap/unguarded.sql");
const SLAP_PREPARE: &str = include_str!("../slap/prepare.sql");
const PG_GUARD: &str = include_str!("../pgbench/guard.sql");
const PG_OUTBOX: &str = include_str!("../pgbench/outbox.sql");
const SLAP_GUARD: &str = include_str!("../slap/guard.sql");
const SLAP_OUTBOX: &str = include_str!("../slap/outbox.sql");
const SLAP_PREPARE_OUTBOX: &str = include_str!("../slap/prepare_outbox.sql");

/// Which of the two scripts a slice runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    /// The guard's statements (`one_write.sql`, `outbox.sql`).
    Guarded,
    /// What it is compared with (`unguarded.sql`, `guard.sql`).
    Control,
}

/// The two scripts a floor runs: the measured mode's statements, and its
/// control's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pair {
    /// `one_write.sql` against `unguarded.sql` (`--scenario dedup`).
    OneWrite,
    /// `outbox.sql` against `guard.sql` (`--scenario outbox`).
    Outbox,
}

impl Pair {
    /// The scripts' names in the report: (guarded, control).
    pub(crate) fn names(self) -> (&'static str, &'static str) {
        match self {
            Pair::OneWrite => ("one_write", "unguarded"),
            Pair::Outbox => ("outbox", "guard"),
        }
    }

    fn pgbench(self) -> (&'static str, &'static str) {
        match self {
            Pair::OneWrite => (PG_ONE_WRITE, PG_UNGUARDED),
            Pair::Outbox => (PG_OUTBOX, PG_GUARD),
        }
    }

    /// The scripts, and the statements they execute, prepared at connect.
    fn slap(self) -> ((&'static str, &'static str), &'static str) {
        match self {
            Pair::OneWrite => ((SLAP_ONE_WRITE, SLAP_UNGUARDED), SLAP_PREPARE),
            Pair::Outbox => ((SLAP_OUTBOX, SLAP_GUARD), SLAP_PREPARE_OUTBOX),
        }
    }
}

/// pgbench's threads (`-j`): the two cores of the machine the figures come from.
const THREADS: usize = 2;

/// The control beside the `one_write` mode.
pub(crate) enum FloorControl {
    /// Not `--scenario dedup` or `outbox` on PostgreSQL or MySQL/MariaDB.
    NotHere,
    /// `dedup`, but no floor (`vs_floor=na floor=<why>`): no C client on
    /// `PATH`, a URL the client would read otherwise than sqlx, or the client
    /// failed its warm-up (its output on stderr).
    Na(&'static str),
    Client(Floor),
}

/// Which C client, and how it reaches the database.
enum Client {
    /// `pgbench`, given loadgen's URL (libpq reads it as sqlx does).
    Pgbench { url: String },
    /// `mariadb-slap` / `mysqlslap`, given the URL's parts; `MYSQL_PWD`
    /// carries a password.
    Slap { args: Vec<String>, password: Option<String> },
}

impl FloorControl {
    /// The control for loadgen's PostgreSQL `url`.
    pub(crate) fn pgbench(url: &str, clients: usize, pair: Pair) -> Result<FloorControl, BoxError> {
        let Some(program) = find(&["pgbench"]) else {
            return Ok(FloorControl::Na("no_pgbench_on_path"));
        };
        // sqlx's `options[key]=value` is no libpq parameter: pgbench would
        // refuse the URL, or (with a search path) write to another table.
        // `options=-c key=value` means the same to both.
        if url.contains("options[") || url.contains("options%5B") {
            eprintln!(
                "no floor: pgbench (libpq) does not read sqlx's `options[key]=value`; write `options=-c key=value`"
            );
            return Ok(FloorControl::Na("url_not_libpq"));
        }
        let client = Client::Pgbench { url: url.to_owned() };
        Ok(FloorControl::Client(Floor::new(program, client, clients, pair, pair.pgbench())?))
    }

    /// The control for loadgen's MySQL/MariaDB `url`.
    pub(crate) fn slap(url: &str, clients: usize, pair: Pair) -> Result<FloorControl, BoxError> {
        let Some(program) = find(&["mariadb-slap", "mysqlslap"]) else {
            return Ok(FloorControl::Na("no_mariadb_slap_on_path"));
        };
        let options: sqlx::mysql::MySqlConnectOptions = url.parse()?;
        let mut args = vec![format!("--user={}", options.get_username())];
        match options.get_socket() {
            Some(socket) => args.push(format!("--socket={}", socket.display())),
            None => args.extend([format!("--host={}", options.get_host()), format!("--port={}", options.get_port())]),
        }
        args.push(format!("--create-schema={}", options.get_database().unwrap_or("test")));
        let (scripts, prepare) = pair.slap();
        args.push(format!("--init-command=BEGIN NOT ATOMIC {} END", statements(prepare).join(" ")));
        // The password as the URL has it; sqlx's options keep it to
        // themselves. One that is percent-encoded is refused, not guessed.
        let userinfo = url.split_once("://").and_then(|(_, rest)| rest.split('/').next()?.rsplit_once('@'));
        let password = userinfo.and_then(|(info, _)| info.split_once(':')).map(|(_, p)| p.to_owned());
        if password.as_deref().is_some_and(|p| p.contains('%')) {
            eprintln!("no floor: a percent-encoded password in the URL; give the slap one without");
            return Ok(FloorControl::Na("url_password_encoded"));
        }
        let client = Client::Slap { args, password };
        Ok(FloorControl::Client(Floor::new(program, client, clients, pair, scripts)?))
    }
}

/// The C client, ready to run the scripts against the database loadgen measures.
pub(crate) struct Floor {
    program: PathBuf,
    client: Client,
    pub(crate) pair: Pair,
    guarded: ScriptFile,
    control: ScriptFile,
    clients: usize,
    /// Throughput of each measured slice of the guarded script
    /// (`one_write`, `outbox`), in run order (one per round).
    pub(crate) slice_tps: Vec<f64>,
    /// The same of the control script (`unguarded`, `guard`).
    pub(crate) control_tps: Vec<f64>,
}

/// A script in its temporary file.
struct ScriptFile {
    path: PathBuf,
    /// Statements per transaction (the slap counts statements, not
    /// transactions).
    statements: usize,
    /// The slap's last throughput, to size its next slice; 0 before the
    /// first.
    tps: f64,
}

/// The slap's script: it sends every `;`-ended piece, comments included, so
/// only the statements, one a line.
fn statements(script: &str) -> Vec<&str> {
    script.lines().filter(|l| !l.starts_with("--") && !l.trim().is_empty()).collect()
}

/// The first of `names` in a directory of `PATH`, if there is one.
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| is_executable(p)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Floor {
    fn new(
        program: PathBuf,
        client: Client,
        clients: usize,
        pair: Pair,
        (guarded, control): (&str, &str),
    ) -> Result<Floor, BoxError> {
        let slap = matches!(client, Client::Slap { .. });
        let file = |name: &str, text: &str| -> Result<ScriptFile, BoxError> {
            let path = std::env::temp_dir().join(format!("idem-loadgen-{}-{name}.sql", std::process::id()));
            let text = if slap { statements(text).join("\n") } else { text.to_owned() };
            let statements = text.lines().count();
            std::fs::write(&path, text)?;
            Ok(ScriptFile { path, statements, tps: 0.0 })
        };
        let (guarded_name, control_name) = pair.names();
        Ok(Floor {
            program,
            client,
            pair,
            guarded: file(guarded_name, guarded)?,
            control: file(control_name, control)?,
            clients,
            slice_tps: Vec::new(),
            control_tps: Vec::new(),
        })
    }

    /// What the client is called in loadgen's report.
    pub(crate) fn name(&self) -> &'static str {
        match self.client {
            Client::Pgbench { .. } => "pgbench",
            Client::Slap { .. } => "mariadb-slap",
        }
    }

    /// Where the scripts are in the source tree.
    pub(crate) fn scripts(&self) -> &'static str {
        match self.client {
            Client::Pgbench { .. } => "bench/pgbench",
            Client::Slap { .. } => "bench/slap",
        }
    }

    /// A slice's length as pgbench's `-T` takes it: whole seconds, at least one.
    pub(crate) fn whole_seconds(length: Duration) -> u64 {
        length.as_secs_f64().round().max(1.0) as u64
    }

    /// One run of `script` for about `length`; its throughput. pgbench runs
    /// [`whole_seconds`](Floor::whole_seconds), its keys prefixed `prefix`
    /// (unique per run), and reports it without its connections' set-up.
    /// The slap runs a number of transactions, sized from its last
    /// throughput (a warm-up's first), and reports the time they took.
    pub(crate) async fn slice(&mut self, script: Script, length: Duration, prefix: &str) -> Result<f64, BoxError> {
        let clients = self.clients;
        let file = match script {
            Script::Guarded => &mut self.guarded,
            Script::Control => &mut self.control,
        };
        let mut command = Command::new(&self.program);
        let transactions = match &self.client {
            Client::Pgbench { url } => {
                let seconds = Floor::whole_seconds(length).to_string();
                command
                    .args(["-n", "-M", "simple", "-c", &clients.to_string(), "-j", &THREADS.to_string()])
                    .args(["-T", &seconds, "-D", "n=0", "-D", &format!("kp={prefix}"), "-f"])
                    .arg(&file.path)
                    .arg(url);
                None
            }
            Client::Slap { args, password } => {
                // Whole transactions for every client; the first run guesses.
                let guess = if file.tps > 0.0 { file.tps } else { 200.0 };
                let each = ((guess * length.as_secs_f64()) / clients as f64).ceil().max(1.0) as usize;
                let queries = each * clients * file.statements;
                command
                    .args(args)
                    .args(["--iterations=1", "--delimiter=;", &format!("--concurrency={clients}")])
                    .arg(format!("--number-of-queries={queries}"))
                    .arg(format!("--query={}", file.path.display()));
                if let Some(password) = password {
                    command.env("MYSQL_PWD", password);
                }
                Some(each * clients)
            }
        };
        // std's process on a blocking thread: the runtime keeps serving
        // (the `--added-rtt-us` proxy runs on it).
        let out = tokio::task::spawn_blocking(move || command.output()).await??;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let failed = text
            .lines()
            .filter_map(|l| l.strip_prefix("number of failed transactions: "))
            .any(|rest| !rest.starts_with("0 "));
        if !out.status.success() || failed {
            return Err(format!("{} ({}) failed:\n{text}", self.program.display(), out.status).into());
        }
        let tps = match transactions {
            None => text
                .lines()
                .find_map(|l| l.strip_prefix("tps = ")?.strip_suffix(" (without initial connection time)"))
                .and_then(|tps| tps.parse::<f64>().ok()),
            Some(transactions) => text
                .lines()
                .find_map(|l| {
                    l.trim().strip_prefix("Average number of seconds to run all queries: ")?.strip_suffix(" seconds")
                })
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| *s > 0.0)
                .map(|s| transactions as f64 / s),
        };
        let tps = tps.ok_or_else(|| format!("no throughput in {}'s output:\n{text}", self.program.display()))?;
        file.tps = tps;
        Ok(tps)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        std::fs::remove_file(&self.guarded.path).ok();
        std::fs::remove_file(&self.control.path).ok();
    }
}
