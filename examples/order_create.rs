//! The seed incident: a user double-clicks "submit" on the order form, and a
//! script then fires the same submit 50 times at once. The form carried a
//! one-time token, issued when the form was rendered; the handler is guarded
//! by `strategy = "token"`, which spends the token in one atomic step (a Lua
//! script on Redis, one locked map operation in memory). One order is
//! created; the 51 other submits get `idem::Error::TokenRejected`, whose
//! message is the one to show the user. The form rendered again (a fresh
//! token) creates a second order.
//!
//! Behind the token, the orders table (`shop_token_orders`) has a unique
//! index on its `token` column. The handler runs with `on_store_error = "allow"` (a token store
//! outage should not stop sales), so while the store is down the index is
//! what stops doubles: step 4 shows it with a store that cannot be reached.
//!
//! Step 5 fires the same 50-submit burst at the check the design warns
//! against: GET the token, then DEL it, two round trips (on Redis with
//! `--redis-url`; in memory, a mutex-guarded set read, a yield, a remove).
//! Every submit that reads the token before the first DEL passes. How many
//! do is a matter of timing, so it is printed, not checked; the unique index
//! catches those doubles too.
//!
//! ```text
//! cargo run --example order_create                       # tokens in memory, SQLite in a temp file
//! cargo run --example order_create -- --redis-url redis://127.0.0.1:6379 \
//!     --database-url postgres://postgres@127.0.0.1:5432/test
//! cargo run --example order_create -- --database-url mysql://root@127.0.0.1:3306/test
//! ```
//!
//! It ends with `store=<tokens>+<database> clicks=52 orders=1 rejected=51
//! fresh_token_orders=1 naive_passed=N errors=0`: 52 submits carried the
//! first token, one order came of them, the fresh token made one more.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use common::{AppError, BoxError, Store, on_pool, sql};
use idem::idempotent;
use idem::token::TokenStore;
use tokio::sync::Barrier;

/// The scope the form's tokens are issued for, and the guard's scope.
const SCOPE: &str = "orders.create";

#[derive(Parser)]
#[command(about = "Double clicks and a submit script create one order per form token")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the form tokens in Redis instead of this process's memory.
    #[arg(long)]
    redis_url: Option<String>,
}

/// What the order form posts (besides its token).
#[derive(Clone, Debug)]
struct OrderForm {
    user_id: i64,
    item: String,
}

/// The guarded handler: the token is spent before the body runs; a spent,
/// expired or unknown token is `TokenRejected`.
#[idempotent(strategy = "token", scope = "orders.create", store = "tokens", on_store_error = "allow")]
async fn create_order(
    db: &Store,
    tokens: &Arc<dyn TokenStore>,
    #[idem(token)] token: &str,
    form: &OrderForm,
) -> Result<String, AppError> {
    insert_order(db, token, form).await
}

/// The order row. A second row with the same token is refused by the unique
/// index, and answered like a spent token.
async fn insert_order(db: &Store, token: &str, form: &OrderForm) -> Result<String, AppError> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let order_no = format!("O{}-{}", common::run_id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let insert = sql(db.name(), "INSERT INTO shop_token_orders (order_no, token, user_id, item) VALUES (?, ?, ?, ?)");
    let done = on_pool!(db, pool => sqlx::query(insert)
        .bind(&order_no).bind(token).bind(form.user_id).bind(&form.item).execute(pool).await.map(drop));
    match done {
        Ok(()) => Ok(order_no),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(idem::Error::TokenRejected.into()),
        Err(e) => Err(e.into()),
    }
}

async fn orders_with(db: &Store, token: &str) -> Result<i64, BoxError> {
    let count = sql(db.name(), "SELECT COUNT(*) FROM shop_token_orders WHERE token = ?");
    Ok(on_pool!(db, pool => sqlx::query_scalar(count).bind(token).fetch_one(pool).await?))
}

/// A token store that cannot be reached: a real Redis client, pointed at a
/// port where no server listens.
fn unreachable_store() -> Result<Arc<dyn TokenStore>, BoxError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(300)))
        .set_number_of_retries(0);
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config)?;
    Ok(Arc::new(idem::store::RedisStore::new(conn, "idem-example:")))
}

/// `n` concurrent submits of `token`, released together; (created, rejected, failed).
async fn burst(db: &Arc<Store>, tokens: &Arc<dyn TokenStore>, token: &str, form: &OrderForm, n: usize) -> [usize; 3] {
    let start = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (db, tokens, token, form, start) =
                (db.clone(), tokens.clone(), token.to_owned(), form.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                create_order(&db, &tokens, &token, &form).await
            })
        })
        .collect();
    let mut counts = [0; 3];
    for task in tasks {
        match task.await.expect("submit task") {
            Ok(_) => counts[0] += 1,
            Err(AppError::Idem(idem::Error::TokenRejected)) => counts[1] += 1,
            Err(e) => {
                println!("   !! {e}");
                counts[2] += 1;
            }
        }
    }
    counts
}

/// The naive check: is the token there? (a pause) delete it. Both round trips
/// are separate, so submits that read before the first delete all pass.
#[derive(Clone)]
enum Naive {
    Redis(redis::aio::ConnectionManager),
    Memory(Arc<Mutex<HashSet<String>>>),
}

impl Naive {
    async fn issue(&self, token: &str) -> Result<(), BoxError> {
        match self {
            Naive::Redis(conn) => {
                let key = format!("idem-example:naive:{token}");
                let _: redis::Value =
                    redis::cmd("SET").arg(key).arg(SCOPE).arg("PX").arg(600_000).query_async(&mut conn.clone()).await?;
            }
            Naive::Memory(set) => drop(set.lock().unwrap().insert(token.to_owned())),
        }
        Ok(())
    }

    async fn check(&self, token: &str) -> Result<bool, BoxError> {
        match self {
            Naive::Redis(conn) => {
                let (key, mut conn) = (format!("idem-example:naive:{token}"), conn.clone());
                let found: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                if found.is_none() {
                    return Ok(false);
                }
                tokio::task::yield_now().await;
                let _: redis::Value = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
            }
            Naive::Memory(set) => {
                if !set.lock().unwrap().contains(token) {
                    return Ok(false);
                }
                tokio::task::yield_now().await;
                set.lock().unwrap().remove(token);
            }
        }
        Ok(true)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = Arc::new(Store::connect(args.database_url.as_deref(), 10).await?);
    let (tokens, naive): (Arc<dyn TokenStore>, Naive) = match &args.redis_url {
        Some(url) => {
            let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            (Arc::new(idem::store::RedisStore::new(conn.clone(), "idem-example:")), Naive::Redis(conn))
        }
        None => (Arc::new(idem::store::MemoryStore::new()), Naive::Memory(Default::default())),
    };
    const DDL: &str = "CREATE TABLE IF NOT EXISTS shop_token_orders (order_no VARCHAR(64) PRIMARY KEY, \
        token VARCHAR(128) NOT NULL UNIQUE, user_id BIGINT NOT NULL, item VARCHAR(64) NOT NULL)";
    on_pool!(&*db, pool => sqlx::query(DDL).execute(pool).await.map(drop)?);

    let store = format!("{}+{}", tokens.kind(), db.name());
    let form = OrderForm { user_id: 42, item: "coffee grinder".to_owned() };
    let ttl = Duration::from_secs(600);
    let mut errors = 0;
    let token = idem::token::issue(&*tokens, SCOPE, ttl).await?;
    println!("store={store}: user {} opens the order form (token {}...)", form.user_id, &token[..8]);

    println!("1. the user double-clicks \"submit\":");
    let (a, b) = tokio::join!(create_order(&db, &tokens, &token, &form), create_order(&db, &tokens, &token, &form));
    let (mut created, mut rejected) = (0, 0);
    for (click, result) in [a, b].into_iter().enumerate() {
        match result {
            Ok(order_no) => {
                created += 1;
                println!("   click {}: order {order_no} created", click + 1);
            }
            Err(AppError::Idem(e @ idem::Error::TokenRejected)) => {
                rejected += 1;
                println!("   click {}: the user reads \"{e}\"", click + 1);
            }
            Err(e) => {
                errors += 1;
                println!("   click {}: !! {e}", click + 1);
            }
        }
    }

    println!("2. a script fires 50 more submits with the same token at once:");
    let [c, r, failed] = burst(&db, &tokens, &token, &form, 50).await;
    println!("   {c} created an order, {r} were rejected, {failed} failed");
    let (clicks, orders) = (2 + 50, orders_with(&db, &token).await?);
    (created, rejected, errors) = (created + c, rejected + r, errors + failed);

    println!("3. the form is rendered again, with a fresh token:");
    let fresh = idem::token::issue(&*tokens, SCOPE, ttl).await?;
    match create_order(&db, &tokens, &fresh, &form).await {
        Ok(order_no) => println!("   order {order_no} created"),
        Err(e) => println!("   !! {e}"),
    }
    let fresh_orders = orders_with(&db, &fresh).await?;

    println!("4. the token store goes down; on_store_error = \"allow\" lets submits through unchecked:");
    let (down, held) = (unreachable_store()?, idem::token::issue(&*tokens, SCOPE, ttl).await?);
    let [c, r, failed] = burst(&db, &down, &held, &form, 2).await;
    let down_orders = orders_with(&db, &held).await?;
    println!("   a double click: {c} order created, {r} stopped by the unique index on the token column");
    errors += failed + usize::from(down_orders != 1);

    println!("5. the same 50-submit burst against a naive GET-then-DEL token check:");
    let naive_token = format!("naive-{}", common::run_id());
    naive.issue(&naive_token).await?;
    let start = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (db, naive, token, form, start) =
                (db.clone(), naive.clone(), naive_token.clone(), form.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                // Ok(None): turned away; Ok(Some(created)): let through.
                match naive.check(&token).await {
                    Ok(false) => Ok(None),
                    Ok(true) => match insert_order(&db, &token, &form).await {
                        Ok(_) => Ok(Some(true)),
                        Err(AppError::Idem(idem::Error::TokenRejected)) => Ok(Some(false)), // the unique index
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                }
            })
        })
        .collect();
    let (mut naive_passed, mut naive_orders) = (0, 0);
    for task in tasks {
        match task.await? {
            Ok(Some(created)) => (naive_passed, naive_orders) = (naive_passed + 1, naive_orders + usize::from(created)),
            Ok(None) => {}
            Err(e) => {
                println!("   !! {e}");
                errors += 1;
            }
        }
    }
    println!("   naive GET-then-DEL let {naive_passed} of 50 through; the unique index let {naive_orders} order in");
    errors += usize::from(naive_orders != 1);

    if orders != 1 || created != 1 || rejected != clicks - 1 || fresh_orders != 1 {
        errors += 1;
    }
    println!(
        "store={store} clicks={clicks} orders={orders} rejected={rejected} fresh_token_orders={fresh_orders} \
         naive_passed={naive_passed} errors={errors}"
    );
    if let Ok(db) = Arc::try_unwrap(db) {
        db.close().await;
    }
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
