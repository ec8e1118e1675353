//! `cargo xtask`: the project's own tasks.

mod cluster;
mod crds;
mod demo;
mod images;
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
    /// The walkthrough for real: a control plane with 2 real nodes, the operator installed
    /// from deploy/operator.yaml, examples/walkthrough applied step by step with kubectl, then
    /// the HA step; torn down at the end unless --keep.
    Demo {
        /// Leave the cluster running (prints how to use and stop it).
        #[arg(long)]
        keep: bool,
    },
    /// Write deploy/crds/*.yaml from crates/kvcache-api.
    Crds,
    /// Write deploy/operator.yaml (the operator's installation), the Helm chart and
    /// deploy/monitoring from crates/kvcache-render; with --out, write only the installation,
    /// with the network settings given, to that file.
    Manifests {
        /// Write the installation here alone (the committed files keep the defaults).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// The address blocks the API server's calls reach the operator's Pods from (the
        /// control plane's): the webhook port admits those alone (docs/isolation.md). Unset: the
        /// webhook port admits every source.
        #[arg(long, value_delimiter = ',', requires = "out")]
        control_plane_cidrs: Vec<String>,
        /// Namespaces whose Pods may read the operator's /metrics, in place of `monitoring`
        /// (an empty value: none).
        #[arg(long, value_delimiter = ',', requires = "out")]
        metrics_from: Option<Vec<String>>,
    },
    /// Install what the tests need (Debian packages, the store's virtualenv, the control plane
    /// built from Go modules), then run every test in the workspace.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Install what the tests need, without running them.
    Setup,
    /// The local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
    /// on 127.0.0.1), with the CRDs installed.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Benchmarks (method and full tables in benches/README.md, current figures in BENCHMARKS.md).
    Bench {
        #[command(subcommand)]
        which: BenchKind,
    },
    /// A local Mooncake store (a master and members on 127.0.0.1).
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Start it (building it first if needed) and print the KUBECONFIG line.
    Up {
        /// Real worker nodes (kubelet + containerd + runc, each in its own network namespace).
        #[arg(long, default_value_t = 0)]
        nodes: usize,
        /// Load the real vLLM engine image (about 5 GB) into the nodes and size them for two
        /// engine replicas each (10 GiB offered instead of 4).
        #[arg(long)]
        real_engine: bool,
        /// Leave NetworkPolicy unenforced (by default the nodes run the harness's enforcer,
        /// kube-router's firewall, so the store's policies hold as on a production cluster).
        #[arg(long)]
        no_network_policy: bool,
    },
    /// Stop every process it started and remove the nodes' namespaces, bridge, routes, mounts
    /// and cgroups.
    Down,
    /// Show its processes, whether the API server answers, and the nodes' readiness.
    Status,
    /// Print `export KUBECONFIG=...` and the PATH holding kubectl.
    Env,
}

#[derive(Subcommand)]
enum BenchKind {
    /// Leader loss to serving and to full capacity, kill -9 and SIGTERM.
    Failover {
        /// Rounds of each.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// From the master registering the last member's segment to `status.capacity` showing it,
    /// on real nodes with the operator.
    Capacity {
        /// Rounds (a member Pod replaced each round).
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
    /// The real vLLM's time to first token with the prompt's blocks in the store, against no
    /// shared cache and a cold store, on a quiet and a busy node, each hit checked against the
    /// reader's own counters (figures in BENCHMARKS.md).
    Prefix {
        /// Prompt lengths in tokens (a length over a model's context is skipped for it).
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
        lengths: Vec<usize>,
        /// Fresh prompts per length, case and condition.
        #[arg(long, default_value_t = 3)]
        prompts: usize,
        /// Models: `llama-bench` (prefill-heavy, 4,096 positions), `tiny-llama` (1,024).
        #[arg(long, value_delimiter = ',', default_value = "llama-bench")]
        models: Vec<String>,
        /// The store's get rate under load, MB/s, for the bound column (`bench transfer`).
        #[arg(long, default_value_t = 100.0)]
        get_rate: f64,
        /// Conditions: `quiet` (nothing else runs), `busy` (the writer serves other prompts).
        #[arg(long, value_delimiter = ',', default_value = "quiet,busy")]
        conditions: Vec<String>,
        /// `NAME=VALUE` added to the attached engines' environment, over the injection's
        /// defaults (the store client's transport settings); repeat for more.
        #[arg(long)]
        engine_env: Vec<String>,
        /// A flag added to the store master's (`-name=value`, the backend's
        /// `leader.extraArgs`); repeat for more.
        #[arg(long, allow_hyphen_values = true)]
        leader_arg: Vec<String>,
        /// The store leader's CPU request in place of the rig's (250m), as `500m`.
        #[arg(long)]
        leader_cpu: Option<String>,
    },
    /// The admission webhook's cost: Binding and injected Pod creates through the API server
    /// with and without the webhook registered, and the handler's own latency.
    Admission {
        /// Creates of each kind per round.
        #[arg(long, default_value_t = 2000)]
        creates: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
        /// Instead: admission latency while one source floods the webhook (slow bodies, idle
        /// connections, forged reviews), what the operator refused and its peak memory.
        #[arg(long)]
        flood: bool,
    },
    /// A member rollout of a memory group on real nodes with the operator: the share of keys
    /// still read back with their bytes, and the time the rollout takes (figures in
    /// BENCHMARKS.md).
    Rollout {
        /// Rounds (a backend of its own each).
        #[arg(long, default_value_t = 1)]
        runs: usize,
    },
    /// The planned changes a platform team makes most often (a member's node cordoned and shut
    /// down, a member group narrowed, the leader's resources, image and arguments, the members'
    /// segment size, an operator restart), each on a backend of its own on real nodes with the
    /// operator: keys kept, the time to settled, the longest time no master served (figures in
    /// BENCHMARKS.md).
    PlannedChanges {
        /// Only these changes (`node-drained`, `group-narrowed`, `leader-resources`,
        /// `leader-image`, `leader-arg`, `segment-size`, `operator-upgrade`); all by default.
        #[arg(long, value_delimiter = ',')]
        changes: Vec<String>,
    },
    /// How soon a Binding created opens its namespace to the store's Pods, a Binding deleted
    /// closes it, and a store client its namespace held open neither writes nor reads, under a
    /// real NetworkPolicy enforcer (docs/isolation.md).
    Isolation {
        /// Open-and-close rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// The store's put/get throughput between the two nodes for 64 KiB to 8 MiB objects, idle
    /// and while both engines serve prompts, beside raw TCP between the same two Pods, for each
    /// client transport setting compared (figures in BENCHMARKS.md).
    Transfer {
        /// The store leader's CPU request in place of the rig's (250m), as `1` (the product's
        /// default).
        #[arg(long)]
        leader_cpu: Option<String>,
    },
    /// Two backends failing over together, again and again, on real nodes with the operator:
    /// moments with two serving masters and members mounted on the other backend's master
    /// (figures in BENCHMARKS.md).
    Soak {
        /// Rounds (both backends' serving leader Pods deleted at once each).
        #[arg(long, default_value_t = 50)]
        failovers: usize,
    },
    /// Many objects: cold-start convergence, operator memory at rest, reconciles per edit.
    Scale {
        /// Backends (one real master each) and pools.
        #[arg(long, default_value_t = 10)]
        backends: usize,
        /// Namespaces (`team-000`, …) the Bindings and ModelDeployments are spread over.
        #[arg(long, default_value_t = 100)]
        namespaces: usize,
        /// Bindings and ModelDeployments per namespace.
        #[arg(long, default_value_t = 20)]
        per_namespace: usize,
    },
}

#[derive(Subcommand)]
enum StoreAction {
    /// Start a master and members.
    Up {
        /// How many members.
        #[arg(long, default_value_t = 2)]
        members: usize,
        /// Segment per member, MiB.
        #[arg(long, default_value_t = 64)]
        segment_mib: u64,
    },
    /// Stop them.
    Down,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Demo { keep } => demo::demo(keep),
        Task::Crds => crds::write(),
        Task::Manifests {
            out: None,
            control_plane_cidrs: _,
            metrics_from: _,
        } => crds::manifests(),
        Task::Manifests {
            out: Some(out),
            control_plane_cidrs,
            metrics_from,
        } => crds::installation(&out, control_plane_cidrs, metrics_from),
        Task::Test { args } => test::run(&args),
        Task::Setup => setup::all().map(|_| ()),
        Task::Cluster { action } => match action {
            ClusterAction::Up {
                nodes,
                real_engine,
                no_network_policy,
            } => cluster::up(nodes, real_engine, !no_network_policy),
            ClusterAction::Down => cluster::down(),
            ClusterAction::Status => cluster::status(),
            ClusterAction::Env => cluster::env(),
        },
        Task::Bench { which } => bench(which),
        Task::Store { action } => match action {
            StoreAction::Up {
                members,
                segment_mib,
            } => cluster::store_up(members, segment_mib),
            StoreAction::Down => cluster::store_down(),
        },
    }
}

/// Runs the benchmark named on the command line (`kvcache-bench`), its arguments checked before
/// the parts are installed.
fn bench(which: BenchKind) -> anyhow::Result<()> {
    use kvcache_bench::{
        admission, capacity, failover, isolation, planned, prefix, rollout, scale, soak, transfer,
    };
    let run: Box<dyn FnOnce() -> anyhow::Result<()>> = match which {
        BenchKind::Failover { runs } => Box::new(move || failover::failover(runs)),
        BenchKind::Capacity { runs } => Box::new(move || capacity::capacity(runs)),
        BenchKind::Prefix {
            lengths,
            prompts,
            models,
            get_rate,
            conditions,
            engine_env,
            leader_arg,
            leader_cpu,
        } => {
            let plan = prefix::Plan::new(&lengths, prompts, &models, get_rate, &conditions)?
                .with_engine_env(&engine_env)?
                .with_leader_args(&leader_arg)?
                .with_leader_cpu(leader_cpu.as_deref())?;
            Box::new(move || prefix::prefix(plan))
        }
        BenchKind::Rollout { runs } => Box::new(move || rollout::rollout(runs)),
        BenchKind::PlannedChanges { changes } => {
            let selection = planned::Selection::new(&changes)?;
            Box::new(move || planned::planned_changes(selection))
        }
        BenchKind::Isolation { rounds } => {
            anyhow::ensure!(rounds > 0, "--rounds must be at least 1");
            Box::new(move || isolation::isolation(rounds))
        }
        BenchKind::Transfer { leader_cpu } => {
            if let Some(c) = &leader_cpu {
                kvcache_bench::check_leader_cpu(c)?;
            }
            Box::new(move || transfer::transfer(leader_cpu))
        }
        BenchKind::Soak { failovers } => Box::new(move || soak::soak(failovers)),
        BenchKind::Admission { flood: true, .. } => Box::new(admission::flood),
        BenchKind::Admission {
            creates,
            concurrency,
            flood: false,
        } => Box::new(move || {
            admission::admission(admission::Shape {
                creates,
                concurrency,
            })
        }),
        BenchKind::Scale {
            backends,
            namespaces,
            per_namespace,
        } => Box::new(move || {
            scale::scale(scale::Shape {
                backends,
                namespaces,
                per_namespace,
            })
        }),
    };
    // Every bench runs on the installed parts.
    setup::all()?;
    run()
}
