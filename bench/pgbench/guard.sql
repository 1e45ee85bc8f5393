-- The bench's `guarded` mode (a dedup guard on a sqlx::Transaction): BEGIN,
-- the claim, the business, the answer, COMMIT: five round trips. The guard's
-- own statements as idem-runtime/src/store/sql/postgres.rs writes them
-- (CLAIM, `complete`), the bound values as literals.
-- A fresh key per transaction: `n` counts this client's transactions (run.sh
-- passes -D n=0; pgbench keeps a client's variables from one transaction to
-- the next) and `kp` (-D) is unique to the pgbench run, so the key
-- ':kp:k' is never used twice.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
-- Prepared once per client (its first transaction), as sqlx prepares each
-- statement once per connection; EXECUTE binds the values.
\if :n = 1
PREPARE coupon (text, int) AS INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id;
PREPARE bump (int) AS UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1;
PREPARE claim (text, text, text, interval) AS INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', $3, now(), now(), clock_timestamp() + $4) ON CONFLICT (scope, idem_key) DO NOTHING;
PREPARE answer (text, text, text) AS UPDATE idem_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2;
\endif
BEGIN;
EXECUTE claim('pgbench.dedup', ':kp:k', NULL, '3600 seconds');
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
EXECUTE answer('pgbench.dedup', ':kp:k', ':id');
COMMIT;
