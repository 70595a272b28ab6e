//! The `sandflow` binary, built by this package so end-to-end tests always
//! run a fresh build of the same entry point (see `harness::server_bin`).

fn main() -> std::process::ExitCode {
    sandflow_server::app::main()
}
