-- The bench's `zero_rt` mode (a dedup guard on an idem::Tx): the claim rides
-- with BEGIN, the answer with COMMIT, in the texts of
-- idem-runtime/src/store/sql/postgres.rs (`claim_text`, `complete_text`) and
-- tx.rs (`commit`: "<answer>; COMMIT; BEGIN", then sqlx's queued ROLLBACK of
-- the empty block, which sqlx sends with the pool's release ping; here it is
-- a round trip of its own). Scope 'pgbench.dedup_zero_rt' (hex below).
-- A fresh key per transaction: `n` counts this client's transactions (run.sh
-- passes -D n=0; pgbench keeps a client's variables from one transaction to
-- the next) and `kp` (-D) is unique to the pgbench run, so the key
-- ':kp:k' is never used twice.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
-- The key's hex digits, ':kph:kh' (see README.md): kh is the 9 digits of k
-- as ASCII in hex ('1' is 31), written as a decimal number.
\set kh 303030303030303030 + (:k / 1 % 10) * 1 + (:k / 10 % 10) * 100 + (:k / 100 % 10) * 10000 + (:k / 1000 % 10) * 1000000 + (:k / 10000 % 10) * 100000000 + (:k / 100000 % 10) * 10000000000 + (:k / 1000000 % 10) * 1000000000000 + (:k / 10000000 % 10) * 100000000000000 + (:k / 100000000 % 10) * 10000000000000000
BEGIN\; INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES (convert_from(decode('706762656e63682e64656475705f7a65726f5f7274', 'hex'), 'UTF8'), convert_from(decode(':kph:kh', 'hex'), 'UTF8'), 'PROCESSING', NULL, now(), now(), clock_timestamp() + 3600000000 * interval '1 microsecond');
INSERT INTO shop_coupons (trade_no, user_id) VALUES (':kp:k', :u) RETURNING id \gset
UPDATE shop_users SET coupons = coupons + 1 WHERE id = :u;
-- The answer (the coupon id as JSON, up to 9 digits) in hex, like kh.
\set idh (30 + :id % 10) + (case when :id >= 10 then (30 + :id / 10 % 10) * 100 else 0 end) + (case when :id >= 100 then (30 + :id / 100 % 10) * 10000 else 0 end) + (case when :id >= 1000 then (30 + :id / 1000 % 10) * 1000000 else 0 end) + (case when :id >= 10000 then (30 + :id / 10000 % 10) * 100000000 else 0 end) + (case when :id >= 100000 then (30 + :id / 100000 % 10) * 10000000000 else 0 end) + (case when :id >= 1000000 then (30 + :id / 1000000 % 10) * 1000000000000 else 0 end) + (case when :id >= 10000000 then (30 + :id / 10000000 % 10) * 100000000000000 else 0 end) + (case when :id >= 100000000 then (30 + :id / 100000000 % 10) * 10000000000000000 else 0 end)
WITH done AS (UPDATE idem_records SET status = 'DONE', response = convert_from(decode(':idh', 'hex'), 'UTF8') WHERE scope = convert_from(decode('706762656e63682e64656475705f7a65726f5f7274', 'hex'), 'UTF8') COLLATE "default" AND idem_key = convert_from(decode(':kph:kh', 'hex'), 'UTF8') COLLATE "default" RETURNING 1) SELECT 1 / count(*) FROM done\; COMMIT\; BEGIN;
ROLLBACK;
