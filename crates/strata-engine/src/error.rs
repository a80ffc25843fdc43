//! Engine errors: one enum, grouped into a small public [`ErrorKind`] that the protocol layer
//! maps to Redis error prefixes.

/// What kind of failure an [`Error`] is, for callers that only need to branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is wrong (bad argument, value not an integer, too large).
    Invalid,
    /// A dependency (object store, disk) cannot serve the request now; retrying may work.
    Unavailable,
    /// Stored bytes failed verification; they were not returned.
    Data,
    /// The engine is shut down or refuses writes after a failed sync.
    Closed,
    /// A bug or an unexpected state.
    Internal,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("value is not an integer or out of range")]
    NotInteger,
    #[error("increment or decrement would overflow")]
    Overflow,
    /// The key holds a value of another kind than the operation works on.
    #[error("Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("{0}")]
    Invalid(String),
    #[error("object store unavailable: {0}")]
    ColdUnavailable(String),
    #[error("storage unavailable: {0}")]
    Storage(String),
    #[error("data error: {0}; the bytes failed their checksum and were not returned")]
    Data(String),
    /// The warm tier is over its hard limit (demotion cannot keep up, or the object store is
    /// unreachable): writes that add bytes are refused until it drains.
    #[error("{0}")]
    WarmFull(String),
    /// The disk under the warm tier is full.
    #[error("{0}")]
    DiskFull(String),
    #[error("the store is closed")]
    Closed,
    #[error("writes refused: a WAL sync failed ({0}); restart Strata after fixing the disk")]
    Poisoned(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotInteger | Error::Overflow | Error::WrongType | Error::Invalid(_) => {
                ErrorKind::Invalid
            }
            Error::ColdUnavailable(_)
            | Error::Storage(_)
            | Error::WarmFull(_)
            | Error::DiskFull(_) => ErrorKind::Unavailable,
            Error::Data(_) => ErrorKind::Data,
            Error::Closed | Error::Poisoned(_) => ErrorKind::Closed,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }
}

impl From<strata_warm::StoreError> for Error {
    fn from(e: strata_warm::StoreError) -> Self {
        use strata_warm::StoreError as S;
        match e {
            S::Corruption(m) => Error::Data(format!("warm store: {m}")),
            S::Invalid(m) => Error::Invalid(format!("warm store: {m}")),
            S::NoSpace(m) => Error::DiskFull(format!(
                "disk full: writes are refused until space is freed, reads still work ({m})"
            )),
            S::Gone(m) => Error::Invalid(m),
            S::Unavailable(m) => Error::Storage(m),
        }
    }
}

impl From<strata_format::FormatError> for Error {
    fn from(e: strata_format::FormatError) -> Self {
        Error::Data(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
