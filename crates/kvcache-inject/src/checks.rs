//! The checks [`inject`](crate::inject) makes before it hands anything over, in its order:
//! the Binding, the ledger, the dtype, the transport, the versions and the launcher; and the
//! warning on a compute dtype other than the cache's.

use kvcache_api::backend::Protocol;

use crate::argv;
use crate::engines::{COMPUTE_DTYPE_FLAG, DTYPE_FLAG, ENGINES, EngineRow};
use crate::error::Error;
use crate::request::{Ledger, Request, Source};
use crate::versions::{self, Pairing};

/// The one protocol the pool offers this engine, or the refusal naming every offer.
pub(crate) fn protocol(req: &Request<'_>) -> Result<(&'static str, Vec<String>), Error> {
    store_protocol(req.engine, req.protocols)
}

/// The one store protocol `protocols` (the effective protocols of a pool's member groups) offer
/// an engine, with warnings, or the `NotSupportedTransport` refusal naming every offer in the
/// artifact spelling and the API value to set (docs/design.md#pool-transport). Admission of a
/// ModelDeployment and the injection make the same judgement.
pub fn store_protocol(
    row: &EngineRow,
    protocols: &[Protocol],
) -> Result<(&'static str, Vec<String>), Error> {
    let mut offers: Vec<(&'static str, &'static str)> = protocols
        .iter()
        .map(|p| (p.artifact(), p.api_value()))
        .collect();
    offers.sort_unstable();
    offers.dedup_by_key(|o| o.0);
    let listed = || {
        offers
            .iter()
            .map(|(a, api)| format!("{a} ({api})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(first) = offers.first() else {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "the pool's backend offers no member group, so {} has no store protocol to use",
                row.name
            ),
        ));
    };
    if offers.len() > 1 {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "the pool's member groups offer mixed protocols ({}); {} installs one transport and fails with NotSupportedTransport on the others: give every group one protocol (spec.transport.protocol or members[].transport.protocol)",
                listed(),
                row.name
            ),
        ));
    }
    let (artifact, _) = *first;
    if let Some(only) = row.only_protocols
        && !only.contains(&artifact)
    {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "{} uses only {} but the pool offers {}: set protocol CANN on the backend (spec.transport.protocol) or on its groups",
                row.name,
                only.join(", "),
                listed()
            ),
        ));
    }
    if row.refused_protocols.contains(&artifact) {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "{} does not support the store protocol {} the pool offers; use a pool whose groups use TCP",
                row.name,
                listed()
            ),
        ));
    }
    let mut warnings = Vec::new();
    if artifact != "tcp" && row.only_protocols.is_none() {
        warnings.push(format!("{} over {artifact} is not verified", row.name));
    }
    Ok((artifact, warnings))
}

/// A float dtype in one spelling (`half` and `float16`, `bf16` and `bfloat16`, `float` and
/// `float32` name one type); `None` for `auto` and for what is not a plain float type (the fp8
/// and fp4 cache types, which engines convert to on purpose).
fn float_type(dtype: &str) -> Option<&'static str> {
    match dtype.trim().to_ascii_lowercase().as_str() {
        "half" | "float16" | "fp16" => Some("float16"),
        "bf16" | "bfloat16" => Some("bfloat16"),
        "float" | "float32" | "fp32" => Some("float32"),
        _ => None,
    }
}

/// A warning when the container's `--dtype` (what the model computes in) names another float
/// type than the KV cache dtype the injection hands the engine (the Binding's
/// `spec.domain.dtype`, when the operator owns it). Such a pairing is not a conversion every
/// engine makes: vLLM 0.32.0 on CPU sizes its cache by `--kv-cache-dtype` and writes blocks in
/// the model's dtype, past the end of the cache for a wider type (the crash traced in
/// `benches/README.md`, "Why the writer crashed at 2,048 tokens busy"). `auto` and an absent
/// flag are not judged: the model's own configuration decides, which the operator cannot read.
pub fn compute_dtype_warning(
    row: &EngineRow,
    argv: &[String],
    kv_dtype: &str,
    dtype_owned: bool,
) -> Option<String> {
    if !dtype_owned {
        return None;
    }
    let given = argv::value_of(argv, COMPUTE_DTYPE_FLAG, row)?;
    let (compute, cache) = (float_type(given)?, float_type(kv_dtype)?);
    if compute == cache {
        return None;
    }
    // A wider compute type writes past the end of a cache sized for the narrower one.
    let harm = if compute == "float32" {
        format!(
            "vLLM 0.32.0 on CPU writes {compute} blocks into a cache sized for {cache}, past its end"
        )
    } else {
        format!("vLLM 0.32.0 on CPU stores {compute} blocks in a cache read as {cache}")
    };
    let binding = if row.dtypes.iter().any(|d| float_type(d) == Some(compute)) {
        format!(", or attach it through a Binding whose spec.domain.dtype is {compute}")
    } else {
        String::new()
    };
    Some(format!(
        "{} computes in {compute} ({COMPUTE_DTYPE_FLAG} {given}) but is handed {DTYPE_FLAG} {kv_dtype} (the Binding's spec.domain.dtype): a KV cache of another float type than the model's is not converted by every engine ({harm}), and the blocks it shares would not be the domain's dtype; run the model with {COMPUTE_DTYPE_FLAG} {cache}{binding}",
        row.name
    ))
}

/// The Binding must be named, and in the container's own namespace.
pub(crate) fn check_binding(binding: &str) -> Result<(), Error> {
    if binding.is_empty() {
        return Err(Error::refused(
            "BindingMissing",
            "kvcache.gpustack.ai/binding is required: name a KVCachePoolBinding of this namespace",
        ));
    }
    if binding.contains('/') {
        return Err(Error::refused(
            "CrossNamespaceBinding",
            format!(
                "binding {binding:?} names another namespace; only a KVCachePoolBinding of this namespace can be named: ask an administrator for one here"
            ),
        ));
    }
    Ok(())
}

/// The tenant id the engine is given: the Binding's domain where the ledger is enforced, none
/// where the store keeps no ledger; refused while the ledger cannot be confirmed.
pub(crate) fn tenant_id<'a>(req: &Request<'a>) -> Result<Option<&'a str>, Error> {
    match &req.ledger {
        Ledger::Enforced => Ok(Some(req.domain)),
        Ledger::Absent => Ok(None),
        Ledger::Unavailable(why) => Err(Error::refused(
            "LedgerNotReady",
            format!(
                "the pool of KVCachePoolBinding {} cannot confirm its tenant ledger ({why}); writes could fail with TENANT_NOT_REGISTERED, so Pods are refused until it recovers",
                req.binding
            ),
        )),
    }
}

/// With the dtype owned, the engine must accept the Binding's dtype as spelled.
pub(crate) fn check_dtype(req: &Request<'_>) -> Result<(), Error> {
    let row = req.engine;
    if req.dtype_owned && !row.dtypes.contains(&req.dtype) {
        return Err(Error::refused(
            "DtypeNotAccepted",
            format!(
                "{} does not accept --kv-cache-dtype {} (the Binding's spec.domain.dtype), so every Pod would fail argument parsing; it accepts {}: use a Binding whose dtype is spelled for {}",
                row.name,
                req.dtype,
                row.dtypes.join(", "),
                row.name
            ),
        ));
    }
    Ok(())
}

/// The store and the engine's client on one Mooncake line: refused when they differ, a warning
/// when a version is unknown.
pub(crate) fn version_warning(req: &Request<'_>) -> Result<Option<String>, Error> {
    let row = req.engine;
    match versions::pair(row, req.store_version, req.engine_version) {
        Pairing::Compatible => Ok(None),
        Pairing::Mismatch { store, client } => Err(Error::refused(
            "StoreVersionMismatch",
            format!(
                "the store runs Mooncake {store} but {} {} carries client {client}: different lines pass every probe and then fail every write (RPC_FAIL -900); pin the backend's spec.image to the {} line, or use an engine version on the store's line",
                row.name,
                req.engine_version.unwrap_or_default(),
                versions::line(&client).unwrap_or_default()
            ),
        )),
        Pairing::Unknown(why) => Ok(Some(why)),
    }
}

/// The program that runs: for the webhook, the user's command past transparent launchers; for
/// a ModelDeployment, the engine's own program (the operator builds the command).
pub(crate) fn launch_of(req: &Request<'_>) -> Result<argv::Launch, Error> {
    let (row, c) = (req.engine, req.container);
    Ok(match req.source {
        Source::Webhook => argv::launch(
            c.command.as_deref().unwrap_or_default(),
            c.args.as_deref().unwrap_or_default(),
            req.launch_args_forwarded,
            row,
            ENGINES,
        )?,
        Source::ModelDeployment => argv::Launch {
            program: row.programs.first().copied().unwrap_or_default().to_owned(),
            module: None,
            forwarded: false,
        },
    })
}
