//! Reading a container's command line as the engine's parser and the shell would: which flag a
//! token sets (in every spelling the parser accepts), and which program really runs.

use crate::engines::EngineRow;
use crate::error::Error;

/// The flag a token sets, normalised (`--kv_transfer_config.kv_role=x` → `--kv-transfer-config`
/// for a parser that accepts underscores and dotted members), or `None` for a non-flag token.
fn token_key(token: &str, row: &EngineRow) -> Option<String> {
    if !token.starts_with("--") || token == "--" {
        return None;
    }
    let key = kvcache_api::rules::flag_key(token);
    let key = if row.underscores_and_members {
        key.split_once('.')
            .map_or(key, |(k, _)| k)
            .replace('_', "-")
    } else {
        key.to_owned()
    };
    Some(format!("--{key}"))
}

/// Whether `token` sets `flag`: exactly, or as a unique prefix among the engine's flags.
pub fn sets(token: &str, flag: &str, row: &EngineRow) -> bool {
    let Some(key) = token_key(token, row) else {
        return false;
    };
    if key == flag {
        return true;
    }
    // argparse accepts an unambiguous abbreviation of a long option.
    key.len() > 3
        && flag.starts_with(&key)
        && !row
            .sibling_flags
            .iter()
            .any(|other| *other != flag && other.starts_with(&key))
}

/// The first token of `argv` that sets `flag`, if any.
pub fn find(argv: &[String], flag: &str, row: &EngineRow) -> Option<usize> {
    argv.iter().position(|t| sets(t, flag, row))
}

/// The value the last token setting `flag` gives it (`--flag value` or `--flag=value`), as the
/// parser keeps the last; `None` when no token sets it or the last one has no value.
pub fn value_of<'a>(argv: &'a [String], flag: &str, row: &EngineRow) -> Option<&'a str> {
    let i = argv.iter().rposition(|t| sets(t, flag, row))?;
    match argv[i].split_once('=') {
        Some((_, v)) => Some(v),
        None => argv.get(i + 1).map(String::as_str),
    }
}

/// What runs in the container, once transparent launchers are stripped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The executable (basename), empty when forwarding was declared and none is readable.
    pub program: String,
    /// The `python -m` module, if that is how it runs.
    pub module: Option<String>,
    /// Whether the user declared that the launcher forwards appended arguments.
    pub forwarded: bool,
}

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

fn is_python(base: &str) -> bool {
    base == "python"
        || base == "python3"
        || base
            .strip_prefix("python3.")
            .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ash", "ksh"];

/// Reads `command` + `args` and decides whether appending engine arguments is safe
/// (docs/design.md#launch-command). `row` decides which programs belong to this engine and which
/// to another.
pub fn launch(
    command: &[String],
    args: &[String],
    forwarded: bool,
    row: &EngineRow,
    all: &[EngineRow],
) -> Result<Launch, Error> {
    if command.is_empty() && args.is_empty() {
        return Err(Error::refused(
            "NoLaunchCommand",
            format!(
                "the container has neither command nor args: appending {} arguments would discard the image's CMD; write the engine's command line in command/args",
                row.name
            ),
        ));
    }
    if command.is_empty() {
        if forwarded {
            return Ok(Launch {
                program: String::new(),
                module: None,
                forwarded,
            });
        }
        return Err(Error::refused(
            "EntrypointNotInspectable",
            "the container sets args but no command, so the image's ENTRYPOINT decides what runs and cannot be inspected; write the command, or annotate kvcache.gpustack.ai/launch-args-forwarded: \"true\" if the ENTRYPOINT passes appended arguments through",
        ));
    }
    let argv: Vec<&str> = command.iter().chain(args).map(String::as_str).collect();
    let mut i = 0;
    let mut launcher = "";
    loop {
        let Some(token) = argv.get(i) else {
            return Err(Error::refused(
                "LauncherWithoutProgram",
                format!(
                    "the launcher {launcher:?} is followed by nothing: an appended flag would become the program; name the engine's program after it"
                ),
            ));
        };
        let base = basename(token);
        launcher = base;
        match base {
            "tini" | "dumb-init" | "catatonit" => i = after_init(&argv, i + 1),
            "env" => i = after_env(&argv, i + 1)?,
            "exec" | "nice" | "nohup" => i += 1,
            b if SHELLS.contains(&b) => return Err(shell_refusal(b, &argv[i + 1..])),
            b if b.ends_with(".sh") => {
                if forwarded {
                    return Ok(Launch {
                        program: b.to_owned(),
                        module: None,
                        forwarded,
                    });
                }
                return Err(script_refusal(token));
            }
            b if is_python(b) => {
                let rest = &argv[i + 1..];
                let module = rest
                    .iter()
                    .position(|t| *t == "-m")
                    .and_then(|p| rest.get(p + 1))
                    .map(|m| (*m).to_owned());
                let target = module.clone().or_else(|| {
                    rest.iter()
                        .find(|t| !t.starts_with('-'))
                        .map(|s| basename(s).to_owned())
                });
                return judge(b, module, target.as_deref(), forwarded, row, all);
            }
            b => return judge(b, None, Some(b), forwarded, row, all),
        }
    }
}

/// Past an init process's own flags (`tini -s --`): the index of the program it runs.
fn after_init(argv: &[&str], mut i: usize) -> usize {
    while let Some(t) = argv.get(i) {
        if *t == "--" {
            return i + 1;
        }
        if !t.starts_with('-') {
            break;
        }
        i += 1;
    }
    i
}

/// Past `env`'s flags and assignments: the index of the program it runs; `env -S` is refused
/// (the command hides inside one argument).
fn after_env(argv: &[&str], mut i: usize) -> Result<usize, Error> {
    while let Some(t) = argv.get(i) {
        if *t == "-S" || t.starts_with("-S") || t.starts_with("--split-string") {
            return Err(Error::refused(
                "HiddenCommand",
                "env -S (--split-string) hides the command inside one argument, so it cannot be inspected; write the program and its arguments as separate items",
            ));
        }
        if *t == "-u" || *t == "-C" || *t == "--unset" || *t == "--chdir" {
            i += 2;
        } else if t.starts_with('-') || t.contains('=') {
            i += 1;
        } else {
            break;
        }
    }
    Ok(i)
}

/// Why a shell launch is refused: `-c` makes an appended flag `$0`; a script's forwarding of
/// `"$@"` cannot be known.
fn shell_refusal(shell: &str, rest: &[&str]) -> Error {
    if rest
        .iter()
        .take_while(|t| t.starts_with('-'))
        .any(|t| t.trim_start_matches('-').contains('c') && !t.starts_with("--"))
    {
        return Error::refused(
            "ShellLaunch",
            format!(
                "{shell} -c runs a command string: an appended flag would become $0, not reach the engine; run the engine's program directly"
            ),
        );
    }
    match rest.iter().find(|t| !t.starts_with('-')) {
        Some(script) if script.ends_with(".sh") => script_refusal(script),
        _ => Error::refused(
            "UnknownLauncher",
            format!(
                "{shell} runs a script whose forwarding of \"$@\" cannot be known; run the engine's program directly or declare forwarding"
            ),
        ),
    }
}

fn script_refusal(script: &str) -> Error {
    Error::refused(
        "ScriptLaunch",
        format!(
            "{script} is a shell script: whether it forwards \"$@\" to the engine cannot be known; run the engine's program directly, or annotate kvcache.gpustack.ai/launch-args-forwarded: \"true\" if it does"
        ),
    )
}

fn judge(
    program: &str,
    module: Option<String>,
    target: Option<&str>,
    forwarded: bool,
    row: &EngineRow,
    all: &[EngineRow],
) -> Result<Launch, Error> {
    let target = target.unwrap_or(program);
    let launch = Launch {
        program: program.to_owned(),
        module,
        forwarded,
    };
    if row.programs.contains(&target) {
        return Ok(launch);
    }
    if let Some(other) = all.iter().find(|r| r.programs.contains(&target)) {
        return Err(Error::refused(
            "WrongProgram",
            format!(
                "{target} runs {}, but the engine is {}: fix the engine annotation (or spec.engine.name), or the command",
                other.name, row.name
            ),
        ));
    }
    if forwarded {
        return Ok(launch);
    }
    Err(Error::refused(
        "UnknownLauncher",
        format!(
            "{target} is not a program known to run {} ({}), so appended arguments may never reach it; run the engine's program directly, or annotate kvcache.gpustack.ai/launch-args-forwarded: \"true\" if it forwards them",
            row.name,
            row.programs.join(", ")
        ),
    ))
}
