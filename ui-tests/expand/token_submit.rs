use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(strategy = "token", scope = "orders.create", source = "frontend")]
pub async fn create_order(#[idem(token)] token: &str, user_id: i64) -> Result<i64, AppError> {
    let _ = (token, user_id);
    Ok(1)
}

fn main() {}
