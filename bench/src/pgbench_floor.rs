//! `vs_floor` and `floor_ratio` of `--scenario dedup` on PostgreSQL: the
//! `one_write` mode against pgbench sending the same statements from its C
//! client (`bench/pgbench/one_write.sql`), and that pgbench run against
//! pgbench sending the unguarded transaction (`bench/pgbench/unguarded.sql`),
//! run by loadgen as two more slices of each round, so that all see the same
//! server, the same tables and the same drift. `vs_floor`: what is left
//! between `one_write` and the C client is the client's (sqlx, Tokio, the
//! pool and idem). `floor_ratio`: what the server allows `ratio_one_write`,
//! the record's insert priced by a client that costs nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::BoxError;

/// The scripts, written to temporary files for `pgbench -f` (loadgen need
/// not run from the source tree).
const ONE_WRITE: &str = include_str!("../pgbench/one_write.sql");
const UNGUARDED: &str = include_str!("../pgbench/unguarded.sql");

/// Which of the two scripts a slice runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    OneWrite,
    Unguarded,
}

/// pgbench's threads (`-j`): the two cores of the machine the figures come from.
const THREADS: usize = 2;

/// The control beside the `one_write` mode.
pub(crate) enum FloorControl {
    /// Not `--scenario dedup` on PostgreSQL.
    NotHere,
    /// `dedup` on PostgreSQL, but no floor (`vs_floor=na floor=<why>`): no
    /// `pgbench` on `PATH`, a URL libpq would read otherwise than sqlx, or
    /// pgbench failed its warm-up (its output on stderr).
    Na(&'static str),
    Pgbench(Floor),
}

impl FloorControl {
    /// The control for `url` (loadgen's, `--scenario dedup` on PostgreSQL).
    pub(crate) fn new(url: &str, clients: usize) -> Result<FloorControl, BoxError> {
        let Some(pgbench) = find() else {
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
        Ok(FloorControl::Pgbench(Floor::new(pgbench, url, clients)?))
    }
}

/// pgbench, ready to run the script against the database loadgen measures.
pub(crate) struct Floor {
    program: PathBuf,
    one_write: PathBuf,
    unguarded: PathBuf,
    url: String,
    clients: usize,
    /// Throughput of each measured `one_write.sql` slice, in run order (one per round).
    pub(crate) slice_tps: Vec<f64>,
    /// The same of `unguarded.sql`.
    pub(crate) unguarded_tps: Vec<f64>,
}

/// `pgbench` in a directory of `PATH`, if there is one.
fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("pgbench")).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Floor {
    /// `url`: the one loadgen's pool uses (through `--added-rtt-us`'s proxy
    /// when there is one), as libpq takes it.
    fn new(program: PathBuf, url: &str, clients: usize) -> Result<Floor, BoxError> {
        let file = |name: &str, text: &str| -> Result<PathBuf, BoxError> {
            let path = std::env::temp_dir().join(format!("idem-loadgen-{}-{name}.sql", std::process::id()));
            std::fs::write(&path, text)?;
            Ok(path)
        };
        Ok(Floor {
            program,
            one_write: file("one_write", ONE_WRITE)?,
            unguarded: file("unguarded", UNGUARDED)?,
            url: url.to_owned(),
            clients,
            slice_tps: Vec::new(),
            unguarded_tps: Vec::new(),
        })
    }

    /// A slice's length as pgbench's `-T` takes it: whole seconds, at least one.
    pub(crate) fn whole_seconds(length: Duration) -> u64 {
        length.as_secs_f64().round().max(1.0) as u64
    }

    /// One pgbench run of `script` for `length` ([`whole_seconds`](Floor::whole_seconds)),
    /// its keys prefixed `prefix` (unique per run); its throughput, without its
    /// connections' set-up (pgbench's "without initial connection time").
    pub(crate) async fn slice(&self, script: Script, length: Duration, prefix: &str) -> Result<f64, BoxError> {
        let seconds = Floor::whole_seconds(length);
        let mut command = Command::new(&self.program);
        command
            .args(["-n", "-M", "simple", "-c", &self.clients.to_string(), "-j", &THREADS.to_string()])
            .args(["-T", &seconds.to_string(), "-D", "n=0", "-D", &format!("kp={prefix}"), "-f"])
            .arg(match script {
                Script::OneWrite => &self.one_write,
                Script::Unguarded => &self.unguarded,
            })
            .arg(&self.url);
        // std's process on a blocking thread: the runtime keeps serving
        // (the `--added-rtt-us` proxy runs on it).
        let out = tokio::task::spawn_blocking(move || command.output()).await??;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let failed = text
            .lines()
            .filter_map(|l| l.strip_prefix("number of failed transactions: "))
            .any(|rest| !rest.starts_with("0 "));
        if !out.status.success() || failed {
            return Err(format!("pgbench ({}) failed:\n{text}", out.status).into());
        }
        text.lines()
            .find_map(|l| l.strip_prefix("tps = ")?.strip_suffix(" (without initial connection time)"))
            .and_then(|tps| tps.parse().ok())
            .ok_or_else(|| format!("no tps in pgbench's output:\n{text}").into())
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        std::fs::remove_file(&self.one_write).ok();
        std::fs::remove_file(&self.unguarded).ok();
    }
}
