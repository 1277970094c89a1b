use clap::Parser;
use istio_init::config::Args;

/// Istio's flag errors exit with 255 (pilot-agent's `os.Exit(-1)`).
const FLAG_ERROR_CODE: i32 = 255;

fn uid_of(user: &str) -> Option<u32> {
    nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

fn main() {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(FLAG_ERROR_CODE);
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0);
        }
    };
    std::process::exit(istio_init::cli::main(
        args,
        &|k| std::env::var(k).ok(),
        &uid_of,
    ));
}
