use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[derive(serde::Serialize)]
pub struct PayCallback {
    pub order_no: String,
}

// The field is `order_no`. The error points at the key, with no fix-it:
// rustc's would replace the whole string (`key = order_no`, broken code).
#[idempotent(key = "cb.order_id")]
async fn pay(tx: &mut Transaction<'_, Postgres>, cb: &PayCallback) -> Result<(), AppError> {
    let _ = (tx, cb);
    Ok(())
}

// The same in `fingerprint`, and in a method call.
#[idempotent(key = "cb.order_no.trim()", fingerprint = "cb.order_id", scope = "pay.again")]
async fn pay_again(tx: &mut Transaction<'_, Postgres>, cb: &PayCallback) -> Result<(), AppError> {
    let _ = (tx, cb);
    Ok(())
}

#[idempotent(key = "cb.order_no.trimm()", scope = "pay.trimmed")]
async fn pay_trimmed(tx: &mut Transaction<'_, Postgres>, cb: &PayCallback) -> Result<(), AppError> {
    let _ = (tx, cb);
    Ok(())
}

// A bare expression has the field's own span: rustc's fix-it is right there.
#[idempotent(key = cb.order_id, scope = "pay.bare")]
async fn pay_bare(tx: &mut Transaction<'_, Postgres>, cb: &PayCallback) -> Result<(), AppError> {
    let _ = (tx, cb);
    Ok(())
}
fn main() {}
