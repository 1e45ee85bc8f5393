-- The statements both scripts execute, prepared once per connection (the
-- slap's `--init-command`, run at every connect), as sqlx prepares each
-- statement once per connection. loadgen removes these comment lines and
-- wraps the rest in `BEGIN NOT ATOMIC ... END` (MariaDB's compound
-- statement), one command. The record's INSERT is idem's `insert_done`
-- (idem-runtime/src/store/sql/record.rs, MySQL's dialect).
PREPARE coupon FROM 'INSERT INTO shop_coupons (trade_no, user_id) VALUES (?, ?)';
PREPARE bump FROM 'UPDATE shop_users SET coupons = coupons + 1 WHERE id = ?';
PREPARE record FROM 'INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) VALUES (?, ?, ''DONE'', CONVERT(? USING utf8mb4), CONVERT(? USING utf8mb4), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)';
