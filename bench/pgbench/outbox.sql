-- The bench's `outbox` mode (`--scenario outbox`): `guard.sql`, and in the
-- body one message published through the outbox, as
-- idem-runtime/src/store/sql/outbox.rs (`OutboxStatements::insert`) writes
-- it, the bound values as literals: six round trips. Without the
-- `pg_notify` that idem adds to at most one insert per 10 ms of a process
-- (`waking_insert`): pgbench cannot space them so, and sent with every
-- message it serializes the commits (about 0.25-0.4 of guard.sql at 16
-- clients, where idem's mode measured 0.4 before it spaced them).
-- A fresh key per transaction, as in guard.sql.
\set n :n + 1
\set k 100000000 + :client_id * 1000000 + :n
\set u random(1, 1000)
\if :n = 1
PREPARE coupon (text, int) AS INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id;
PREPARE bump (int) AS UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1;
PREPARE claim (text, text, text, interval) AS INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', $3, now(), now(), clock_timestamp() + $4) ON CONFLICT (scope, idem_key) DO NOTHING;
PREPARE publish (text, text, text, text, bytea, text, interval) AS INSERT INTO idem_outbox (message_id, scope, idem_key, topic, payload, headers, status, attempts, next_attempt_at, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, now(), now(), clock_timestamp() + $7) RETURNING seq;
PREPARE answer (text, text, text) AS UPDATE idem_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2;
\endif
BEGIN;
EXECUTE claim('pgbench.outbox', ':kp:k', NULL, '3600 seconds');
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
EXECUTE publish('pgbench-msg-:kp:k-0', 'pgbench.outbox', ':kp:k', 'coupons.granted', '{"trade_no":":kp:k","coupon":0}', '[["content-type","application/json"]]', '3600 seconds');
EXECUTE answer('pgbench.outbox', ':kp:k', ':id');
COMMIT;
