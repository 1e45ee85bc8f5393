-- Leave a tenth of each page of the record table free, so that a guard's
-- answer (an UPDATE of the record its claim inserted) fits on the record's
-- own page and is a HOT update: no new index entries, no second copy of
-- the row elsewhere. On full pages (a table grown large, purged and
-- vacuumed, or bulk-loaded) none are HOT; at 10 M records that cost the
-- default guard about a sixth of its throughput (BENCHMARKS.md, R8).
-- Takes effect for pages filled from now on; existing rows stay where they
-- are. Idempotent, like 0001.
ALTER TABLE idem_records SET (fillfactor = 90);
