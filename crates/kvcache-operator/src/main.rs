//! `kvcache-operator`: runs the operator, and offline prints its CRDs, checks manifests and
//! renders what the operator would create.

mod cli;
mod context;
mod controllers;
mod election;
mod error;
mod run;
mod serve;
mod store;
mod telemetry;
mod watch;
mod webhook;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if let cli::Command::Run(run_args) = args.command {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                return ExitCode::from(2);
            }
        };
        return match runtime.block_on(run::run(*run_args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
