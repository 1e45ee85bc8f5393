#[derive(idem::StateMachine)]
#[state(table = "orders", key_colum = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

fn main() {}
