//! The one error type of the `sandflow` crate boundary.

use snafu::Snafu;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
pub enum Error {
    /// The SQL text could not be parsed or planned.
    #[snafu(display("{message}"))]
    Sql { message: String },
    /// The statement is larger or deeper than sandflow accepts (SQLSTATE 54001).
    #[snafu(display("{message}"))]
    TooComplex { message: String },
    /// A new database, table or flow name breaks the naming rule (see
    /// `catalog::check_name`; SQLSTATE 42602).
    #[snafu(display("{message}"))]
    InvalidName { message: String },
    /// The statement was stopped (statement timeout, cancel request) before it
    /// wrote anything (SQLSTATE 57014).
    #[snafu(display("{message}"))]
    Cancelled { message: String },
    /// The statement is not allowed in the transaction's state (SQLSTATE
    /// 25P02 in a failed block, 25001 where a block may not be open).
    #[snafu(display("{message}"))]
    Transaction { message: String },
    /// The statement is valid SQL but refers to something that is not there.
    #[snafu(display("{message}"))]
    NotFound { message: String },
    /// No flow of that name (GreptimeDB's code 8001).
    #[snafu(display("{message}"))]
    FlowNotFound { message: String },
    /// A flow of that name exists already (GreptimeDB's code 8000).
    #[snafu(display("{message}"))]
    FlowExists { message: String },
    /// A table of that name exists already (GreptimeDB's code 4000, SQLSTATE
    /// 42P07).
    #[snafu(display("{message}"))]
    TableExists { message: String },
    /// No database of that name (GreptimeDB's code 4004, SQLSTATE 3D000).
    #[snafu(display("{message}"))]
    DatabaseNotFound { message: String },
    /// The statement met a concurrent change it cannot be applied over (an
    /// ALTER TABLE); it wrote nothing and may simply run again (SQLSTATE
    /// 40001).
    #[snafu(display("{message}"))]
    Conflict { message: String },
    /// The session's user may not do this (SQLSTATE 42501, HTTP 403).
    #[snafu(display("{message}"))]
    PermissionDenied { message: String },
    /// A login failed: unknown user or wrong password (SQLSTATE 28P01, HTTP
    /// 401).
    #[snafu(display("{message}"))]
    AuthFailed { message: String },
    /// Valid SQL that sandflow does not implement (yet).
    #[snafu(display("{message}"))]
    Unsupported { message: String },
    /// Rows that do not fit the table (types, NULL time index, ...).
    #[snafu(display("{message}"))]
    InvalidData { message: String },
    /// Text that is not valid UTF-8, or holds a NUL character (SQLSTATE 22021).
    #[snafu(display("{message}"))]
    InvalidEncoding { message: String },
    /// A server-wide limit that a setting raises (SQLSTATE 53400).
    #[snafu(display("{message}"))]
    LimitExceeded { message: String },
    /// A component of that name exists already in the database (SQLSTATE
    /// 42710); CREATE OR REPLACE COMPONENT adds a version instead.
    #[snafu(display("{message}"))]
    ComponentExists { message: String },
    /// No component of that name, or no such version of it (SQLSTATE 42704).
    #[snafu(display("{message}"))]
    ComponentNotFound { message: String },
    /// Uploaded bytes that are not a flow component this server may run: not
    /// wasm, a core module, another world or version, a forbidden import, or
    /// a compilation that failed or ran out of time (SQLSTATE 42P13).
    #[snafu(display("{message}"))]
    InvalidComponent { message: String },
    /// Input larger than a server limit allows (SQLSTATE 54000, HTTP 413).
    #[snafu(display("{message}"))]
    TooLarge { message: String },
    /// The object is still used by another one, e.g. a component by a flow
    /// (SQLSTATE 2BP01).
    #[snafu(display("{message}"))]
    InUse { message: String },
    /// Storage or I/O failure.
    #[snafu(display("storage error: {message}"))]
    Storage { message: String },
    /// A flow's sandbox failed (trap, limit, guest error).
    #[snafu(display("flow error: {message}"))]
    Flow { message: String },
    /// Anything else that is our bug.
    #[snafu(display("internal error: {message}"))]
    Internal { message: String },
}

impl Error {
    /// A copy of this error (same kind and message); used to carry our errors
    /// through DataFusion, whose error type owns them.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Sql { message } => Error::Sql {
                message: message.clone(),
            },
            Error::NotFound { message } => Error::NotFound {
                message: message.clone(),
            },
            Error::FlowNotFound { message } => Error::FlowNotFound {
                message: message.clone(),
            },
            Error::FlowExists { message } => Error::FlowExists {
                message: message.clone(),
            },
            Error::TableExists { message } => Error::TableExists {
                message: message.clone(),
            },
            Error::InvalidName { message } => Error::InvalidName {
                message: message.clone(),
            },
            Error::DatabaseNotFound { message } => Error::DatabaseNotFound {
                message: message.clone(),
            },
            Error::TooComplex { message } => Error::TooComplex {
                message: message.clone(),
            },
            Error::Cancelled { message } => Error::Cancelled {
                message: message.clone(),
            },
            Error::Transaction { message } => Error::Transaction {
                message: message.clone(),
            },
            Error::Unsupported { message } => Error::Unsupported {
                message: message.clone(),
            },
            Error::Conflict { message } => Error::Conflict {
                message: message.clone(),
            },
            Error::PermissionDenied { message } => Error::PermissionDenied {
                message: message.clone(),
            },
            Error::AuthFailed { message } => Error::AuthFailed {
                message: message.clone(),
            },
            Error::InvalidData { message } => Error::InvalidData {
                message: message.clone(),
            },
            Error::InvalidEncoding { message } => Error::InvalidEncoding {
                message: message.clone(),
            },
            Error::LimitExceeded { message } => Error::LimitExceeded {
                message: message.clone(),
            },
            Error::ComponentExists { message } => Error::ComponentExists {
                message: message.clone(),
            },
            Error::ComponentNotFound { message } => Error::ComponentNotFound {
                message: message.clone(),
            },
            Error::InvalidComponent { message } => Error::InvalidComponent {
                message: message.clone(),
            },
            Error::TooLarge { message } => Error::TooLarge {
                message: message.clone(),
            },
            Error::InUse { message } => Error::InUse {
                message: message.clone(),
            },
            Error::Storage { message } => Error::Storage {
                message: message.clone(),
            },
            Error::Flow { message } => Error::Flow {
                message: message.clone(),
            },
            Error::Internal { message } => Error::Internal {
                message: message.clone(),
            },
        }
    }
}
