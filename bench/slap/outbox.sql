-- The bench's `outbox` mode on MariaDB: guard.sql, and in the body one
-- message published through the outbox.
BEGIN;
EXECUTE claim USING 'slap.outbox', @k := CONCAT('S', UUID_SHORT()), NULL, 3600000000;
EXECUTE coupon USING @k, @u := FLOOR(1 + RAND() * 1000);
EXECUTE bump USING @u;
EXECUTE publish USING CONCAT('slap-msg-', @k, '-0'), 'slap.outbox', @k, 'coupons.granted', CONCAT('{"trade_no":"', @k, '","coupon":0}'), '[["content-type","application/json"]]', 3600000000;
EXECUTE answer USING LAST_INSERT_ID(), 'slap.outbox', @k;
COMMIT;
