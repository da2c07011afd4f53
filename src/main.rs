fn main() {
    if let Err(e) = fact::cli::main() {
        eprintln!("error: {e:#}");
        std::process::exit(fact::cli::exit_code(&e));
    }
}
