-- The shop's tables as examples/common/mod.rs creates them on PostgreSQL
-- (`Shop::setup`), and the state loadgen's reset leaves idem_records in
-- (bench/src/main.rs, `Handwritten::reset`): 10,000 filler records, the
-- earlier pgbench runs' rows gone, the tables vacuumed and analyzed.
CREATE TABLE IF NOT EXISTS shop_coupons (id BIGSERIAL PRIMARY KEY, trade_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS shop_coupons_trade_no ON shop_coupons (trade_no);
CREATE TABLE IF NOT EXISTS shop_users (id BIGINT PRIMARY KEY, coupons BIGINT NOT NULL DEFAULT 0);
INSERT INTO shop_users (id) SELECT generate_series(1, 1000) ON CONFLICT DO NOTHING;
DELETE FROM idem_records WHERE scope LIKE 'pgbench.%';
DELETE FROM shop_coupons WHERE trade_no LIKE 'P%';
INSERT INTO idem_records (scope, idem_key, status, created_at, updated_at, expires_at)
SELECT 'loadgen.filler', 'F' || g, 'DONE', now(), now(), now() + interval '100 years'
FROM generate_series(1, 10000) g ON CONFLICT DO NOTHING;
VACUUM ANALYZE idem_records;
VACUUM ANALYZE shop_coupons;
VACUUM ANALYZE shop_users;
