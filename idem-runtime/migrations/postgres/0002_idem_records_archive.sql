-- Completed records kept for reconciliation after their retention, when
-- idem::purge_expired runs with PurgeOptions { archive: true, .. }.
-- Idempotent, like 0001.
CREATE TABLE IF NOT EXISTS idem_records_archive (
    scope       VARCHAR(191) NOT NULL,
    idem_key    VARCHAR(191) NOT NULL,
    status      VARCHAR(16)  NOT NULL,
    fingerprint VARCHAR(64),
    response    TEXT,
    owner       VARCHAR(64),
    fence       BIGINT       NOT NULL,
    lease_until TIMESTAMPTZ,
    created_at  TIMESTAMPTZ  NOT NULL,
    updated_at  TIMESTAMPTZ  NOT NULL,
    expires_at  TIMESTAMPTZ  NOT NULL,
    archived_at TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (scope, idem_key, created_at)
);
