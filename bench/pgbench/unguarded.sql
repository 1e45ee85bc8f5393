-- The bench's `unguarded` mode: the business transaction alone.
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
\endif
BEGIN;
EXECUTE coupon(':kp:k', :u) \gset
EXECUTE bump(:u);
COMMIT;
