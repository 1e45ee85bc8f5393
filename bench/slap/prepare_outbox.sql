-- The statements of guard.sql and outbox.sql, prepared once per connection
-- as prepare.sql's are (see there). The claim and the answer are the dedup
-- guard's on MySQL (idem-runtime/src/store/sql/mysql.rs, record.rs), the
-- message's insert `OutboxStatements::insert` (outbox.rs).
PREPARE coupon FROM 'INSERT INTO shop_coupons (trade_no, user_id) VALUES (?, ?)';
PREPARE bump FROM 'UPDATE shop_users SET coupons = coupons + 1 WHERE id = ?';
PREPARE claim FROM 'INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES (?, ?, ''PROCESSING'', CONVERT(? USING utf8mb4), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)';
PREPARE publish FROM 'INSERT INTO idem_outbox (message_id, scope, idem_key, topic, payload, headers, status, attempts, next_attempt_at, created_at, expires_at) VALUES (CONVERT(? USING utf8mb4), ?, ?, CONVERT(? USING utf8mb4), ?, CONVERT(? USING utf8mb4), ''pending'', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)';
PREPARE answer FROM 'UPDATE idem_records SET status = ''DONE'', response = CONVERT(? USING utf8mb4), updated_at = UTC_TIMESTAMP(6) WHERE scope = ? AND idem_key = ?';
