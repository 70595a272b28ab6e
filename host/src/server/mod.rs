//! The front doors: PostgreSQL wire protocol and HTTP.
