//! What an admission judges: the violations and warnings of one object ([`Verdict`]) and the
//! rules of one kind ([`Admission`]).

use std::fmt;

use crate::settings::Settings;

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Where, as a path in the manifest (`spec.connection.managed.members[0].medium`).
    pub field: String,
    /// Why, and what to do instead.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The outcome of admission: every violation and every warning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Refusals; the object is admitted only when this is empty.
    pub violations: Vec<Violation>,
    /// Admitted, but the user should know.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether the object is admitted.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    pub(crate) fn refuse(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.violations.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(crate) fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }

    /// Whether some violation's field starts with `field` and its message contains `fragment`.
    pub fn refuses(&self, field: &str, fragment: &str) -> bool {
        self.violations
            .iter()
            .any(|v| v.field.starts_with(field) && v.message.contains(fragment))
    }
}

/// Admission for one kind.
pub trait Admission {
    /// The rules judged when the object is created.
    fn validate_create(&self, settings: &Settings) -> Verdict;
    /// The rules judged when `old` is replaced by `self`; ratcheting rules only judge values
    /// the update moves.
    fn validate_update(&self, old: &Self, settings: &Settings) -> Verdict;
}
