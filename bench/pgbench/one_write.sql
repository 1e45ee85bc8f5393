-- The bench's `one_write` mode (a dedup guard on an idem::Tx with
-- `claim = "commit"`): BEGIN, the business, then the record with its answer,
-- COMMIT and sqlx's chained BEGIN in one text, as idem-runtime/src/tx
-- writes them (postgres.rs `insert_done`, `Texts::commit` "COMMIT; BEGIN";
-- core.rs `commit_with_record`), then the ROLLBACK sqlx queues for the empty
-- block (in loadgen it rides with the pool's release ping; here it is a round
-- trip of its own). The values are escape-string literals, as `text` writes
-- them: the scope, the key and the answer hold only characters it leaves as
-- they are, so E'...' with no escapes. loadgen runs this script itself, in a
-- slice of each round (`vs_floor`); run.sh runs it too (SCRIPTS=...).
-- A fresh key per transaction: `n` counts this client's transactions (-D n=0;
-- pgbench keeps a client's variables from one transaction to the next) and
-- `kp` (-D) is unique to the pgbench run, so the key ':kp:k' is never used twice.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
-- Prepared once per client (its first transaction), as sqlx prepares each
-- statement once per connection; EXECUTE binds the values.
\if :n = 1
PREPARE coupon (text, int) AS INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id;
PREPARE bump (int) AS UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1;
\endif
BEGIN;
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) VALUES (E'pgbench.dedup_one_write', E':kp:k', 'DONE', NULL, E':id', now(), now(), clock_timestamp() + 3600000000 * interval '1 microsecond')\; COMMIT\; BEGIN;
ROLLBACK;
