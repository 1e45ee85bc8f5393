-- Nothing to do on SQLite: PostgreSQL's 0003 sets the record table's fill
-- factor, and SQLite has none (an update rewrites the row in its B-tree).
-- The file keeps one numbering of migrations on every backend; the
-- statement is a no-op.
SELECT 1;
