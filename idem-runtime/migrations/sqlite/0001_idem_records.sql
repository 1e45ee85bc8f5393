-- idem dedup/lease records (SQLite). idem::migrate() runs this file; it is
-- idempotent, so it can also go into your own migration tool as is.
-- Timestamps are milliseconds since the Unix epoch. SQLite does not enforce
-- VARCHAR lengths, so the CHECKs do: a value the other backends would refuse
-- is refused here too, never silently stored.
CREATE TABLE IF NOT EXISTS idem_records (
    scope       TEXT    NOT NULL CHECK (length(scope) <= 191),
    idem_key    TEXT    NOT NULL CHECK (length(idem_key) <= 191),
    status      TEXT    NOT NULL CHECK (status IN ('PROCESSING', 'DONE', 'FAILED')),
    fingerprint TEXT,
    response    TEXT,
    owner       TEXT,
    fence       INTEGER NOT NULL DEFAULT 0,
    lease_until INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
