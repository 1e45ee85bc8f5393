-- The bench's `guarded` mode of `--scenario outbox` on MariaDB (a dedup
-- guard on a sqlx::Transaction): BEGIN, the claim, the business, the
-- answer, COMMIT. A fresh key per transaction, as in unguarded.sql.
BEGIN;
EXECUTE claim USING 'slap.outbox_guard', @k := CONCAT('S', UUID_SHORT()), NULL, 3600000000;
EXECUTE coupon USING @k, @u := FLOOR(1 + RAND() * 1000);
EXECUTE bump USING @u;
EXECUTE answer USING LAST_INSERT_ID(), 'slap.outbox_guard', @k;
COMMIT;
