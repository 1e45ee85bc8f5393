//! MySQL/MariaDB: no texts. An `idem::Tx` sends the guard's statements
//! one by one, bound and prepared, as on a `sqlx::Transaction` (the docs of
//! [`Tx`](super::Tx) say why).

use sqlx::MySql;

use crate::store::sql::texts::TxSql;

impl TxSql for MySql {
    // `texts`: none (the docs of `Tx` say why).

    const ROLLBACK: &'static str = "ROLLBACK AND NO CHAIN NO RELEASE";
}
