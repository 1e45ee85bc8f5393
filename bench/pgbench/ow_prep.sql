-- one_write.sql with the record's `INSERT` prepared once per client
-- (`EXECUTE rec(...)`) instead of written out and planned every call: what
-- the parsing and planning cost. Not a mode of loadgen's; README.md, "What
-- one write costs".
-- A fresh key per transaction, as in one_write.sql.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
-- Prepared once per client (its first transaction), as sqlx prepares each
-- statement once per connection; EXECUTE binds the values.
\if :n = 1
PREPARE coupon (text, int) AS INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id;
PREPARE bump (int) AS UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1;
PREPARE rec (text, text, text) AS INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) VALUES ($1, $2, 'DONE', NULL, $3, now(), now(), clock_timestamp() + 3600000000 * interval '1 microsecond');
\endif
BEGIN;
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
EXECUTE rec(E'pgbench.dedup_one_write', E':kp:k', E':id')\; COMMIT\; BEGIN;
ROLLBACK;
