-- The transactional outbox: messages a guarded body published in its
-- transaction, waiting for the relay (idem::outbox::Relay) to hand them to
-- a broker. A row commits or rolls back with the body's writes.
-- Timestamps are UTC, as in 0001; scope and idem_key VARBINARY, as there.
-- Idempotent, like 0001.
--   seq          the relay's order: a key's messages go out by seq
--                (assigned at insert; a key's calls take turns on its
--                record, so within a key seq is commit order)
--   message_id   idem-msg-<hash of scope, key, ordinal>: the consumer's key
--   scope, idem_key   the aggregate: the call, as its record stores it
--   status       pending (claimable, or claimed until claim_until), sent, dead
-- InnoDB has no partial index: status leads the indexes the relay's claim
-- reads (pending rows in seq order; a key's earlier pending one).
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    message_id      VARCHAR(64)  NOT NULL,
    scope           VARBINARY(191) NOT NULL,
    idem_key        VARBINARY(191) NOT NULL,
    topic           VARCHAR(255) NOT NULL,
    payload         LONGBLOB     NOT NULL,
    headers         MEDIUMTEXT,
    status          VARCHAR(16)  NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NOT NULL,
    last_error      TEXT,
    claimed_by      VARCHAR(64),
    claim_until     DATETIME(6),
    created_at      DATETIME(6)  NOT NULL,
    sent_at         DATETIME(6),
    expires_at      DATETIME(6)  NOT NULL,
    PRIMARY KEY (seq),
    INDEX idem_outbox_pending (status, seq),
    INDEX idem_outbox_key (scope, idem_key, status, seq),
    INDEX idem_outbox_expires (status, expires_at),
    INDEX idem_outbox_message (message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
