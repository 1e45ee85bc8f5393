//! Reaching the stores the URLs name, with errors that say which and why.

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::store::RedisStore;

use crate::error::Failure;
use crate::opt::StoreArgs;
use crate::store::{Sql, Store};

/// How long connecting to a server may take before the command gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Each store given, the database first: the order of the output.
pub(crate) async fn each(given: &StoreArgs) -> Result<Vec<Store>, Failure> {
    let mut stores = Vec::new();
    if let Some(url) = &given.database_url {
        stores.push(Store::Sql(sql(url, false).await?));
    }
    if let Some(url) = &given.redis_url {
        stores.push(Store::Redis(RedisStore::new(connect_redis(url).await?, &given.redis_prefix)));
    }
    #[cfg(feature = "etcd")]
    if let Some(url) = &given.etcd_url {
        stores.push(Store::Etcd(connect_etcd(url).await?.prefix(&given.etcd_prefix)));
    }
    Ok(stores)
}

/// The SQL database at `url`. `create`: a SQLite file that does not exist
/// yet is created (for `migrate`); otherwise it is an error.
pub(crate) async fn sql(url: &str, create: bool) -> Result<Sql, Failure> {
    let shown = redact(url);
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    let failed = |e: &dyn std::fmt::Display| Failure::error(format!("cannot connect to {shown}: {e}"));
    match scheme.as_str() {
        "postgres" | "postgresql" => {
            let options = sqlx::postgres::PgConnectOptions::from_str(url).map_err(|e| bad_url(&shown, e))?;
            Ok(Sql::Postgres(pool(options).await.map_err(|e| failed(&e))?))
        }
        "mysql" | "mariadb" => {
            let url = format!("mysql:{}", &url[scheme.len() + 1..]);
            let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).map_err(|e| bad_url(&shown, e))?;
            Ok(Sql::Mysql(pool(options).await.map_err(|e| failed(&e))?))
        }
        "sqlite" => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
                .map_err(|e| bad_url(&shown, e))?
                .create_if_missing(create)
                .busy_timeout(CONNECT_TIMEOUT);
            let pool = pool(options).await.map_err(|e| {
                if create {
                    failed(&e)
                } else {
                    Failure::error(format!(
                        "cannot open {shown}: {e} (a database file that does not exist yet is created by `idem migrate`)"
                    ))
                }
            })?;
            Ok(Sql::Sqlite(pool))
        }
        _ => Err(Failure::usage(format!(
            "--database-url {shown}: unknown scheme `{scheme}`; use postgres://, mysql:// (or mariadb://) or sqlite:"
        ))),
    }
}

fn bad_url(shown: &str, e: sqlx::Error) -> Failure {
    Failure::usage(format!("--database-url {shown} is not a valid URL: {e}"))
}

/// A small pool, after one plain connection within [`CONNECT_TIMEOUT`]: the
/// pool's own connect would retry a refused connection until its acquire
/// timeout, and a command should say at once that the server is down.
async fn pool<DB: sqlx::Database>(
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    use sqlx::Connection;
    let first = tokio::time::timeout(CONNECT_TIMEOUT, DB::Connection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    first.close().await?;
    Ok(sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options))
}

async fn connect_redis(url: &str) -> Result<redis::aio::ConnectionManager, Failure> {
    let shown = redact(url);
    let client = redis::Client::open(url)
        .map_err(|e| Failure::usage(format!("--redis-url {shown} is not a valid Redis URL: {e}")))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_number_of_retries(1);
    redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| Failure::error(format!("cannot connect to Redis at {shown}: {e}")))
}

/// The etcd cluster of `etcd://host:port[,host:port...]`.
#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str) -> Result<idem_runtime::store::EtcdStore, Failure> {
    let shown = redact(url);
    let hosts = url
        .strip_prefix("etcd://")
        .filter(|h| !h.is_empty() && !h.contains(['/', '@']))
        .ok_or_else(|| Failure::usage(format!("--etcd-url {shown}: write it etcd://host:port[,host:port...]")))?;
    let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
    idem_runtime::store::EtcdStore::connect(&endpoints, None)
        .await
        .map_err(|e| Failure::error(format!("cannot connect to etcd at {shown}: {e}")))
}

/// `url` with its password, if any, written `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return url.to_owned() };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("redis://:pw@127.0.0.1:6379/0"), "redis://:***@127.0.0.1:6379/0");
        assert_eq!(redact("mysql://root@127.0.0.1/test"), "mysql://root@127.0.0.1/test");
        assert_eq!(redact("sqlite:/tmp/x.db"), "sqlite:/tmp/x.db");
    }
}
