-- Completed records kept for reconciliation after their retention, when
-- idem::purge_expired runs with PurgeOptions { archive: true, .. }.
-- Timestamps are epoch milliseconds, as in 0001. Idempotent, like 0001.
CREATE TABLE IF NOT EXISTS idem_records_archive (
    scope       TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    fingerprint TEXT,
    response    TEXT,
    owner       TEXT,
    fence       INTEGER NOT NULL,
    lease_until INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    archived_at INTEGER NOT NULL,
    PRIMARY KEY (scope, idem_key, created_at)
);
