-- The bench's `zero_rt` mode (a dedup guard on an idem::Tx): the claim rides
-- with BEGIN, the answer with COMMIT, in the texts of
-- idem-runtime/src/store/sql/postgres.rs (`claim_text`, `complete_text`) and
-- tx.rs (`commit`: "<answer>; COMMIT; BEGIN", then sqlx's queued ROLLBACK of
-- the empty block, which sqlx sends with the pool's release ping; here it is
-- a round trip of its own). The values are escape-string literals, as `text`
-- writes them: the scope, the key and the answer hold only characters it
-- leaves as they are (letters, digits, '.', '_', '-'), so E'...' with no escapes.
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
PREPARE idem_claim_1 (text, text, text, int8) AS INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', $3, now(), now(), clock_timestamp() + $4 * interval '1 microsecond');
PREPARE idem_complete_1 (text, text, text) AS WITH done AS (UPDATE idem_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2 RETURNING 1) SELECT 1 / count(*) FROM done;
\endif
BEGIN\; EXECUTE idem_claim_1(E'pgbench.dedup_zero_rt', E':kp:k', NULL, 3600000000);
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
EXECUTE idem_complete_1(E'pgbench.dedup_zero_rt', E':kp:k', E':id')\; COMMIT\; BEGIN;
ROLLBACK;
