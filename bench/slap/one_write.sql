-- The bench's `one_write` mode on MariaDB (a dedup guard on an idem::Tx
-- with `claim = "commit"`), for mariadb-slap: the business, then the record
-- with its answer (the coupon's id), then `COMMIT`, as idem sends them
-- there. A fresh key per transaction, as in unguarded.sql. loadgen removes
-- these comment lines before it passes the file on.
BEGIN;
EXECUTE coupon USING @k := CONCAT('S', UUID_SHORT()), @u := FLOOR(1 + RAND() * 1000);
EXECUTE bump USING @u;
EXECUTE record USING 'slap.dedup_one_write', @k, NULL, LAST_INSERT_ID(), 3600000000;
COMMIT;
