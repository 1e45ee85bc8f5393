-- idem dedup/lease records (MySQL 8 / MariaDB 10.5+). idem::migrate() runs this
-- file; it is idempotent, so it can also go into your own migration tool as is.
-- Timestamps are UTC (written with UTC_TIMESTAMP(6)). scope and idem_key are
-- VARBINARY: a _bin collation of utf8mb4 is PAD SPACE in MariaDB and MySQL 5.7,
-- where 'T100' and 'T100 ' compare equal and would share one record.
CREATE TABLE IF NOT EXISTS idem_records (
    scope       VARBINARY(191) NOT NULL,
    idem_key    VARBINARY(191) NOT NULL,
    status      VARCHAR(16)  NOT NULL CHECK (status IN ('PROCESSING', 'DONE', 'FAILED')),
    fingerprint VARCHAR(64),
    response    MEDIUMTEXT,
    owner       VARCHAR(64),
    fence       BIGINT       NOT NULL DEFAULT 0,
    lease_until DATETIME(6),
    created_at  DATETIME(6)  NOT NULL,
    updated_at  DATETIME(6)  NOT NULL,
    expires_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (scope, idem_key),
    INDEX idem_records_expires_at (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
