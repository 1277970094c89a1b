//! pilot-agent: the command line (`pilot_agent::cli`) and its exit code.

fn main() {
    std::process::exit(pilot_agent::cli::main(std::env::args().collect()));
}
