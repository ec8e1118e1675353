//! What an injection refuses with: one error, its CamelCase reason and a message naming the key
//! and the fix.

/// A refusal: a CamelCase reason and a message naming the key, the engine and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The container cannot be attached.
    #[error("{reason}: {message}")]
    Refused {
        /// CamelCase, searchable.
        reason: &'static str,
        /// What and how to fix.
        message: String,
    },
}

impl Error {
    pub(crate) fn refused(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Refused {
            reason,
            message: message.into(),
        }
    }

    /// The refusal's CamelCase reason (e.g. `DtypeNotAccepted`), for conditions and admission
    /// answers.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Refused { reason, .. } => reason,
        }
    }
}
