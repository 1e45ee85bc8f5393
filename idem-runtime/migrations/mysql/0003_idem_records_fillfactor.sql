-- Nothing to do on MySQL/MariaDB: PostgreSQL's 0003 sets the record table's
-- fill factor, which InnoDB has no per-table form of (innodb_fill_factor is
-- server-wide and applies to index builds only); InnoDB updates a row in
-- place in its clustered index. The file keeps one numbering of migrations
-- on every backend; the statement is a no-op.
DO 0;
