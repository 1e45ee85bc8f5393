-- The bench's `outbox` mode (`--scenario outbox`): `guard.sql`, and in the
-- body one message published through the outbox, as
-- idem-runtime/src/store/sql/outbox.rs (`OutboxStatements::insert`) and
-- postgres.rs (`insert_sql`: the insert and its `pg_notify`, delivered on
-- commit) write it, the bound values as literals: six round trips.
-- A fresh key per transaction, as in guard.sql.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
\if :n = 1
PREPARE coupon (text, int) AS INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id;
PREPARE bump (int) AS UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1;
PREPARE claim (text, text, text, interval) AS INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', $3, now(), now(), clock_timestamp() + $4) ON CONFLICT (scope, idem_key) DO NOTHING;
PREPARE publish (text, text, text, text, bytea, text, interval) AS WITH m AS (INSERT INTO idem_outbox (message_id, scope, idem_key, topic, payload, headers, status, attempts, next_attempt_at, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, now(), now(), clock_timestamp() + $7) RETURNING seq) SELECT m.seq FROM m, (SELECT pg_notify('idem_outbox', '')) AS n;
PREPARE answer (text, text, text) AS UPDATE idem_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2;
\endif
BEGIN;
EXECUTE claim('pgbench.outbox', ':kp:k', NULL, '3600 seconds');
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
EXECUTE publish('pgbench-msg-:kp:k-0', 'pgbench.outbox', ':kp:k', 'coupons.granted', '{"trade_no":":kp:k","coupon":0}', '[["content-type","application/json"]]', '3600 seconds');
EXECUTE answer('pgbench.outbox', ':kp:k', ':id');
COMMIT;
