#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    Paid,
}

fn main() {}
