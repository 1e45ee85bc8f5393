-- Completed records kept for reconciliation after their retention, when
-- idem::purge_expired runs with PurgeOptions { archive: true, .. }.
-- Idempotent, like 0001.
CREATE TABLE IF NOT EXISTS idem_records_archive (
    scope       VARBINARY(191) NOT NULL,
    idem_key    VARBINARY(191) NOT NULL,
    status      VARCHAR(16)  NOT NULL,
    fingerprint VARCHAR(64),
    response    MEDIUMTEXT,
    owner       VARCHAR(64),
    fence       BIGINT       NOT NULL,
    lease_until DATETIME(6),
    created_at  DATETIME(6)  NOT NULL,
    updated_at  DATETIME(6)  NOT NULL,
    expires_at  DATETIME(6)  NOT NULL,
    archived_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (scope, idem_key, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
