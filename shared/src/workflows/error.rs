//! The workflows' error vocabulary: why a workflow stopped, with the error that made it stop
//! kept as its `source` (never flattened into a string), the exit code chosen by the kind of
//! stop in one place ([`Kind::exit_code`]), and the one printer of an error with its causes
//! ([`chain`]) that every binary, log line and the webhook use.
//!
//! After omicron's `docs/error-types-and-logging.adoc`: a variant carries its context (the
//! flag, the step) plus `#[source]`, and its `Display` never repeats the source ("Pitfall 2"),
//! so only [`chain`] shows the whole story, once.
//!
//! One enum or one per workflow: `bootstrap` and `bootstrap delete` share one
//! [`WorkflowError`] — they are one binary with one exit-code table, and they stop for the
//! same reasons (bad input, a state a person must resolve, a step that failed, a declined
//! confirmation). `reconcile` ([`crate::workflows::reconcile::ReconcileError`]) and `scale`
//! ([`crate::workflows::scale::ScaleError`]) keep enums of their own: reconcile runs
//! unattended and has no flags or named steps to report, and scale's variants are what the
//! webhook maps to HTTP answers. All of them are built from the pieces here ([`BoxError`],
//! [`Message`], [`Context`]) and pick their exit code through [`Kind`].

use std::error::Error as StdError;
use std::fmt;

/// Any error, as a source.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a stop asks of whoever runs the workflow; decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The input is wrong: fix it and run again (exit 2).
    Input,
    /// The world is in a state a person must resolve before a run can succeed (exit 2).
    NeedsPerson,
    /// Something failed on the way; running again continues from where this run got (exit 1).
    Retry,
    /// The person did not confirm (exit 1).
    Declined,
}

impl Kind {
    /// The process exit code of this kind of stop (see each binary's module docs).
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::Input | Kind::NeedsPerson => 2,
            Kind::Retry | Kind::Declined => 1,
        }
    }
}

/// Why `bootstrap` or `bootstrap delete` stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// Bad input, named by the flag (or input) it came from: `--kubeconfig: …`. From
    /// validation nothing was created.
    #[error("{flag}")]
    Input {
        flag: &'static str,
        #[source]
        source: BoxError,
    },
    /// Bad input whose own text names its flags (a spec with several problems, credentials
    /// resolved from flags, environment and files).
    #[error(transparent)]
    Inputs(BoxError),
    /// A state a person must resolve, found at `step` (credentials the rack refuses, a name
    /// someone else's object holds, VMs without the resume file that made them).
    #[error("{step}")]
    NeedsPerson {
        step: &'static str,
        #[source]
        source: BoxError,
    },
    /// `step` failed; re-running continues from where this run got.
    #[error("{step}")]
    Step {
        step: &'static str,
        #[source]
        source: BoxError,
    },
    /// The person did not confirm the delete; nothing was deleted.
    #[error("not confirmed: nothing was deleted")]
    Declined,
}

impl WorkflowError {
    /// Bad `flag`, because of `source`.
    pub fn input(flag: &'static str, source: impl Into<BoxError>) -> Self {
        WorkflowError::Input {
            flag,
            source: source.into(),
        }
    }

    /// Bad input described by `source` alone.
    pub fn inputs(source: impl Into<BoxError>) -> Self {
        WorkflowError::Inputs(source.into())
    }

    /// A person must resolve `source`, found at `step`.
    pub fn needs_person(step: &'static str, source: impl Into<BoxError>) -> Self {
        WorkflowError::NeedsPerson {
            step,
            source: source.into(),
        }
    }

    /// `step` failed because of `source`.
    pub fn step(step: &'static str, source: impl Into<BoxError>) -> Self {
        WorkflowError::Step {
            step,
            source: source.into(),
        }
    }

    /// What this stop asks for.
    pub fn kind(&self) -> Kind {
        match self {
            WorkflowError::Input { .. } | WorkflowError::Inputs(_) => Kind::Input,
            WorkflowError::NeedsPerson { .. } => Kind::NeedsPerson,
            WorkflowError::Step { .. } => Kind::Retry,
            WorkflowError::Declined => Kind::Declined,
        }
    }

    /// The process exit code ([`Kind::exit_code`]).
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }

    /// The step this stop happened at, when it names one.
    pub fn step_name(&self) -> Option<&'static str> {
        match self {
            WorkflowError::NeedsPerson { step, .. } | WorkflowError::Step { step, .. } => {
                Some(step)
            }
            _ => None,
        }
    }
}

/// A problem described by its text alone, with no underlying error: the source of an error
/// whose message is the whole story ("no control-plane VM to attach the API floating IP to").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message(pub String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

/// `text` as a source.
pub fn message(text: impl Into<String>) -> BoxError {
    Box::new(Message(text.into()))
}

/// What was being done (`"reading /etc/x"`) when `source` happened.
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct Context {
    context: String,
    #[source]
    source: BoxError,
}

/// `source`, with what was being done when it happened.
pub fn context(context: impl Into<String>, source: impl Into<BoxError>) -> BoxError {
    Box::new(Context {
        context: context.into(),
        source: source.into(),
    })
}

/// An error and its causes on one line: `outer: cause: root cause`. A cause whose text is
/// already part of what is printed (an error that repeats its source) is left out, and line
/// breaks become spaces. The one way errors are printed, by every binary and log line.
pub fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cur = s.source();
    }
    out.replace('\n', " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// An error that repeats its source in its own text (as `{0}`-style errors do).
    #[derive(Debug, thiserror::Error)]
    #[error("outer repeats: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn the_chain_prints_every_cause_in_order() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = WorkflowError::step("state", context("reading /x", io));
        assert_eq!(chain(&e), "state: reading /x: no such file");
    }

    #[test]
    fn a_cause_already_in_its_parents_text_is_printed_once() {
        let io = std::io::Error::other("connection refused");
        let e = WorkflowError::step("wait-api", Repeats(io));
        assert_eq!(chain(&e), "wait-api: outer repeats: connection refused");
    }

    #[test]
    fn a_transparent_input_prints_its_source_alone_on_one_line() {
        let e = WorkflowError::inputs(message("--cluster: bad\n--project: worse"));
        assert_eq!(chain(&e), "--cluster: bad --project: worse");
        let e = WorkflowError::input("--kubeconfig", message("is a directory"));
        assert_eq!(chain(&e), "--kubeconfig: is a directory");
    }

    #[test]
    fn a_secret_held_beside_an_error_is_not_printed() {
        // The chain prints Display texts only: a value an error keeps but does not show
        // (as the credential types keep tokens) never reaches it.
        #[derive(Debug, thiserror::Error)]
        #[error("the rack refused the token")]
        struct Refused {
            #[allow(dead_code)]
            token: String,
        }
        let e = WorkflowError::needs_person(
            "project",
            Refused {
                token: "oxide-token-SECRET".into(),
            },
        );
        let printed = chain(&e);
        assert_eq!(printed, "project: the rack refused the token");
        assert!(!printed.contains("SECRET"));
    }

    #[test]
    fn the_exit_code_follows_the_kind() {
        let m = || message("x");
        assert_eq!(WorkflowError::input("--cluster", m()).exit_code(), 2);
        assert_eq!(WorkflowError::inputs(m()).exit_code(), 2);
        assert_eq!(WorkflowError::needs_person("resume", m()).exit_code(), 2);
        assert_eq!(WorkflowError::step("image", m()).exit_code(), 1);
        assert_eq!(WorkflowError::Declined.exit_code(), 1);
    }

    #[test]
    fn a_step_failure_keeps_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = WorkflowError::step("write-kubeconfig", io);
        let source = e.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!(e.step_name(), Some("write-kubeconfig"));
    }
}
