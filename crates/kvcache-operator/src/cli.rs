//! The command line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kvcache_api::Settings;
use kvcache_api::manifest::{self, Manifest};

/// The kvcache-operator: a shared Mooncake KV cache for vLLM and SGLang, driven by kubectl apply.
#[derive(Parser, Debug)]
#[command(name = "kvcache-operator", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator: reconcile KVCacheBackends (and, as they arrive, the other kinds)
    /// against the cluster in KUBECONFIG or the one this Pod runs in.
    Run(Box<crate::run::RunArgs>),
    /// Print every CustomResourceDefinition as YAML (what `kubectl apply -f` installs).
    Crds,
    /// Check manifests offline against the admission rules, as `kubectl apply` would be judged.
    ///
    /// Prints each refusal (field and reason) and each warning; exits 1 when anything is
    /// refused. With --old, objects found in both are judged as updates of the old ones.
    Validate {
        /// A manifest file or a directory of them (`*.yaml`, `*.yml`, `*.json`), read in name order.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// The stored objects the manifests would replace (file or directory).
        #[arg(long)]
        old: Option<PathBuf>,
        /// Cluster settings as YAML (`kv-cache-backend-image`, `model-deployment-kv-cache-dtype-owned`).
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// Print every object the operator would create for the given manifests, resolving their
    /// references (backend, pool, binding, model deployment, instance type) offline.
    Render {
        /// A manifest file or a directory of them.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Cluster settings as YAML.
        #[arg(long)]
        settings: Option<PathBuf>,
        /// The operator's namespace (where store workloads run).
        #[arg(long, default_value = kvcache_render::plan::resolve::DEFAULT_NAMESPACE)]
        namespace: String,
    },
}

/// What a command can fail with before it judges anything.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file or directory that cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// A `-f`, `--old` or `--settings` argument, or a file in a directory given to one.
        path: PathBuf,
        source: std::io::Error,
    },
    /// A manifest that cannot be parsed.
    #[error(transparent)]
    Api(#[from] kvcache_api::Error),
    /// A rendered object could not be written as YAML.
    #[error("cannot write a rendered object as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// Writing to standard output failed.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        // `main` runs it on a runtime; nothing to do here.
        Command::Run(_) => Ok(ExitCode::SUCCESS),
        Command::Crds => {
            for (i, crd) in kvcache_api::crd::all().iter().enumerate() {
                if i > 0 {
                    writeln!(out, "---")?;
                }
                write!(out, "{}", kvcache_api::crd::to_yaml(crd)?)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Render {
            files,
            settings,
            namespace,
        } => {
            let settings = load_settings(settings.as_deref())?;
            let mut objects = Vec::new();
            for f in &files {
                objects.extend(load(f)?.into_iter().map(|m| m.object));
            }
            let env = kvcache_render::plan::resolve::Environment {
                namespace: &namespace,
                settings: &settings,
            };
            match kvcache_render::plan::resolve::render_all(&objects, &env) {
                Ok(docs) => {
                    // Serialise everything first: a failure prints nothing rather than a
                    // partial or empty document.
                    let texts = docs
                        .iter()
                        .map(serde_yaml::to_string)
                        .collect::<Result<Vec<_>, _>>()?;
                    write!(out, "{}", texts.join("---\n"))?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(errors) => {
                    for e in errors {
                        eprintln!("error: {e}");
                    }
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Validate {
            files,
            old,
            settings,
        } => {
            let settings = load_settings(settings.as_deref())?;
            let mut new = Vec::new();
            for f in &files {
                new.extend(load(f)?);
            }
            let old = match old {
                Some(path) => load(&path)?,
                None => Vec::new(),
            };
            let refused = validate(&new, &old, &settings, &mut out)?;
            Ok(if refused {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

fn load_settings(path: Option<&Path>) -> Result<Settings, CliError> {
    Ok(match path {
        Some(path) => Settings::from_yaml(&path.display().to_string(), &read(path)?)?,
        None => Settings::default(),
    })
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every manifest in a file, or in the manifest files of a directory in name order.
pub fn load(path: &Path) -> Result<Vec<Manifest>, CliError> {
    let meta = std::fs::metadata(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })?;
    let files = if meta.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| CliError::Read {
                path: path.to_owned(),
                source,
            })?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut out = Vec::new();
    for f in files {
        out.extend(manifest::parse(&f.display().to_string(), &read(&f)?)?);
    }
    Ok(out)
}

/// Judges every manifest (as an update where `old` holds the same object) with the same pure
/// judgement the admission webhook makes, and prints the outcome. Returns whether anything was
/// refused.
pub fn validate(
    new: &[Manifest],
    old: &[Manifest],
    settings: &Settings,
    out: &mut impl Write,
) -> Result<bool, CliError> {
    let reviews = kvcache_render::admission::review::review_manifests(new, old, settings);
    let mut refused = false;
    for (m, r) in new.iter().zip(&reviews) {
        let verdict = if r.allowed() { "ok     " } else { "refused" };
        refused |= !r.allowed();
        writeln!(
            out,
            "{verdict}  {} ({}, {}#{})",
            r.object, r.mode, m.source, m.index
        )?;
        for refusal in &r.refusals {
            writeln!(out, "  - {refusal}")?;
        }
        for w in &r.warnings {
            writeln!(out, "  warning: {w}")?;
        }
    }
    Ok(refused)
}
