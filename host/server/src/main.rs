//! The `sandflow` binary; see `sandflow --help`.

fn main() -> std::process::ExitCode {
    sandflow_server::app::main()
}
