use idem::idempotent;


#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "trade_no")]
async fn pay(trade_no: &str) -> Result<(), AppError> {
    let _ = trade_no;
    Ok(())
}
fn main() {}
