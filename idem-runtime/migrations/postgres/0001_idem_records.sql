-- idem dedup/lease records (PostgreSQL). idem::migrate() runs this file; it is
-- idempotent, so it can also go into your own migration tool as is.
CREATE TABLE IF NOT EXISTS idem_records (
    scope       VARCHAR(191) NOT NULL,
    idem_key    VARCHAR(191) NOT NULL,
    status      VARCHAR(16)  NOT NULL CHECK (status IN ('PROCESSING', 'DONE', 'FAILED')),
    fingerprint VARCHAR(64),
    response    TEXT,
    owner       VARCHAR(64),
    fence       BIGINT       NOT NULL DEFAULT 0,
    lease_until TIMESTAMPTZ,
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
