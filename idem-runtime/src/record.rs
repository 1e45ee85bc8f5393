//! What a record holds: plain data, as stores and the operator's tools
//! read it.

/// Lifecycle of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed; the guarded work has not finished (or its worker died).
    Processing,
    /// Finished; the record holds the response to replay.
    Done,
    /// The work failed in a way that allows a retry (lease strategy).
    Failed,
}

impl RecordStatus {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Processing => "PROCESSING",
            RecordStatus::Done => "DONE",
            RecordStatus::Failed => "FAILED",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<RecordStatus> {
        match s {
            "PROCESSING" => Some(RecordStatus::Processing),
            "DONE" => Some(RecordStatus::Done),
            "FAILED" => Some(RecordStatus::Failed),
            _ => None,
        }
    }
}

/// A stored record, as [`crate::sql::find_record`] returns it.
///
/// Timestamps are the store's clock in milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupRecord {
    /// Scope of the guard that wrote it.
    pub scope: String,
    /// The stored key (keys over [`crate::key::MAX_PLAIN_KEY_LEN`] bytes are hashed).
    pub key: String,
    /// Lifecycle state.
    pub status: RecordStatus,
    /// Hex SHA-256 of the request payload, when the guard declares a fingerprint.
    pub fingerprint: Option<String>,
    /// JSON of the first call's `Ok` value, once `Done`. `None` on a `Done`
    /// record: the call ran to success but its answer could not be kept
    /// (repeats get [`crate::Error::AnswerNotKept`]).
    pub response: Option<String>,
    /// Worker that holds the lease (lease strategy).
    pub owner: Option<String>,
    /// Fencing counter: incremented on every reclaim.
    pub fence: i64,
    /// End of the current lease (lease strategy).
    pub lease_until_ms: Option<i64>,
    /// When the record was written.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
    /// When it may be purged.
    pub expires_at_ms: i64,
}
