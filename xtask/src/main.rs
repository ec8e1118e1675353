//! `cargo xtask`: the project's own tasks.

mod crds;
mod setup;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "The kvcache-operator project's tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Write deploy/crds/*.yaml from crates/kvcache-api.
    Crds,
    /// Install what the tests need (Debian packages, the store's virtualenv, the control plane
    /// built from Go modules), then run every test in the workspace.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Install what the tests need, without running them.
    Setup,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Crds => crds::write(),
        Task::Test { args } => test::run(&args),
        Task::Setup => setup::all().map(|_| ()),
    }
}
