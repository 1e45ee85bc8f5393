#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Payed, Canceled))]
    WaitPay,
    #[state(code = 2)]
    Paid,
    #[state(code = 9)]
    Canceled,
}

fn main() {}
