#[derive(idem::StateMachine)]
#[state(table = "orders")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

fn main() {}
