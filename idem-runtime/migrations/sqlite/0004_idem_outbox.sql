-- The transactional outbox: messages a guarded body published in its
-- transaction, waiting for the relay (idem::outbox::Relay) to hand them to
-- a broker. A row commits or rolls back with the body's writes.
-- Timestamps are epoch milliseconds, as in 0001. Idempotent, like 0001.
--   seq          the relay's order: a key's messages go out by seq
--                (AUTOINCREMENT: never reused after a purge)
--   message_id   idem-msg-<hash of scope, key, ordinal>: the consumer's key
--   scope, idem_key   the aggregate: the call, as its record stores it
--   status       pending (claimable, or claimed until claim_until), sent, dead
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT    NOT NULL CHECK (length(message_id) <= 64),
    scope           TEXT    NOT NULL CHECK (length(scope) <= 191),
    idem_key        TEXT    NOT NULL CHECK (length(idem_key) <= 191),
    topic           TEXT    NOT NULL CHECK (length(topic) <= 255),
    payload         BLOB    NOT NULL,
    headers         TEXT,
    status          TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    claimed_by      TEXT,
    claim_until     INTEGER,
    created_at      INTEGER NOT NULL,
    sent_at         INTEGER,
    expires_at      INTEGER NOT NULL
);
-- The relay's claim reads pending rows in seq order, and asks of each
-- whether its key has an earlier pending one: both on small partial
-- indexes, however many sent rows wait for the purge.
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (seq) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_key ON idem_outbox (scope, idem_key, seq) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_dead ON idem_outbox (seq) WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS idem_outbox_expires ON idem_outbox (expires_at) WHERE status = 'sent';
CREATE INDEX IF NOT EXISTS idem_outbox_message ON idem_outbox (message_id);
