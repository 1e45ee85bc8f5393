use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A gateway callback never fetched a token: tokens cannot stop its repeats.
#[idempotent(strategy = "token", scope = "payments.callback", source = "callback")]
async fn on_pay_callback(#[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}
fn main() {}
