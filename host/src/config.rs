//! Server settings: flags, TOML file, environment.
