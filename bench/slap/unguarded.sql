-- The bench's `unguarded` mode on MariaDB: the business transaction alone,
-- for mariadb-slap: one statement per round trip, the statements of
-- prepare.sql executed with their values. A fresh key per transaction:
-- `UUID_SHORT()` is unique to the server, and the user is one of the
-- 1,000, both kept in session variables for the statements after. loadgen
-- removes these comment lines before it passes the file on (the client
-- sends each `;`-ended piece as it is).
BEGIN;
EXECUTE coupon USING @k := CONCAT('S', UUID_SHORT()), @u := FLOOR(1 + RAND() * 1000);
EXECUTE bump USING @u;
COMMIT;
