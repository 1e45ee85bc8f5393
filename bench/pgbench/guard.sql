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
BEGIN;
INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at)
VALUES ('pgbench.dedup', ':kp:k', 'PROCESSING', NULL, now(), now(), clock_timestamp() + '3600 seconds'::interval)
ON CONFLICT (scope, idem_key) DO NOTHING;
INSERT INTO shop_coupons (trade_no, user_id) VALUES (':kp:k', :u) RETURNING id \gset
UPDATE shop_users SET coupons = coupons + 1 WHERE id = :u;
UPDATE idem_records SET status = 'DONE', response = ':id' WHERE scope = 'pgbench.dedup' AND idem_key = ':kp:k';
COMMIT;
