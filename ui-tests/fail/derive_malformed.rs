// `#[derive(StateMachine)]` on what it cannot describe, one mistake per item.

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub struct NotAnEnum;

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum Generic<T> {
    #[state(code = 1)]
    Only(T),
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum NoStates {}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status", stored_as = "blob")]
pub enum StoredAsUnknown {
    #[state(code = 1)]
    Open,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status", stored_as = "name")]
pub enum CodeWithNames {
    #[state(code = 1, to(Closed))]
    Open,
    #[state(name = "it's")]
    Closed,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum NameWithCodes {
    #[state(code = 1, name = "OPEN")]
    Open,
    #[state(code = 3)]
    Closed = 2,
    Other = 1 + 2,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum TargetOfAnotherEnum {
    #[state(code = 1, to(NameWithCodes::Closed))]
    Open,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status", table = "again")]
pub enum ArgumentTwice {
    #[state(code = 1)]
    Open,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum AttributeUnparsable {
    #[state(code = )]
    Open,
}

#[derive(idem::StateMachine)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum CodeNotAnInteger {
    #[state(code = "one")]
    Open,
}

fn main() {}
