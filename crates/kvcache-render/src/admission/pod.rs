//! The Pod injection webhook's decision (docs/design.md#pod-injection): for an opted-in Pod, its
//! Binding, pool and backend, either the Pod with the store settings added (through the same
//! `kvcache-inject` entry point the ModelDeployment render uses) or a refusal with its reason.
//! Pure: the webhook looks the objects up, calls [`inject_pod`] and answers with the difference.
//!
//! Refusals decided here: the annotation contract (unknown keys, submitted records, a `domain`
//! key, a missing or invalid engine), the container choice, and the references (Binding
//! missing or being deleted, pool or backend missing, the pool's ledger and endpoint). The rest
//! (owned keys, dtype, launch command, volumes, transport, role) are `kvcache-inject`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kvcache_api::model::{EngineName, EngineNetworkPolicy};
use kvcache_api::pool::KVCachePool;
use kvcache_api::pool::pool_conditions::QUOTA_LEDGER_AVAILABLE;
use kvcache_inject::{
    CLIENT_CONFIG_ANNOTATION, INJECTED_ANNOTATION, Ledger, Request, Source, engines, inject,
    parse_role,
};

use crate::objects::attachment::{Environment, attachment_on};
use crate::objects::engine_access::{
    ENGINE_POLICY_LABEL, INJECT_LABEL, NETWORK_POLICY_ANNOTATION, policy_token,
};
use crate::objects::model::Attachment;
use crate::world::{Chain, MissingLink};

/// The Binding of the Pod's namespace.
pub(crate) const BINDING_ANNOTATION: &str = "kvcache.gpustack.ai/binding";
/// `vLLM` or `SGLang`.
pub(crate) const ENGINE_ANNOTATION: &str = "kvcache.gpustack.ai/engine";
/// `ascend` (vLLM only).
pub(crate) const MANUFACTURER_ANNOTATION: &str = "kvcache.gpustack.ai/manufacturer";
/// `Prefill` or `Decode`.
pub(crate) const ROLE_ANNOTATION: &str = "kvcache.gpustack.ai/role";
/// Which container, when there are several.
pub(crate) const CONTAINER_ANNOTATION: &str = "kvcache.gpustack.ai/container";
/// The launcher passes appended args through.
pub(crate) const FORWARDED_ANNOTATION: &str = "kvcache.gpustack.ai/launch-args-forwarded";
const PREFIX: &str = "kvcache.gpustack.ai/";

/// A refused Pod: the reason (CamelCase) and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct PodRefusal {
    /// CamelCase reason a user can search for, e.g. `RecordSubmitted`.
    pub reason: &'static str,
    /// What is wrong with the Pod and how to fix it.
    pub message: String,
}

fn refuse(reason: &'static str, message: impl Into<String>) -> PodRefusal {
    PodRefusal {
        reason,
        message: message.into(),
    }
}

/// The injected Pod and the warnings to hand back.
#[derive(Clone, Debug, PartialEq)]
pub struct Injected {
    /// The Pod with the store settings.
    pub pod: Pod,
    /// Admitted, but worth knowing.
    pub warnings: Vec<String>,
}

/// The annotation keys a Pod may carry under our prefix, the binding and the engine aside from
/// what the webhook writes itself.
const ACCEPTED: [&str; 7] = [
    BINDING_ANNOTATION,
    ENGINE_ANNOTATION,
    MANUFACTURER_ANNOTATION,
    ROLE_ANNOTATION,
    CONTAINER_ANNOTATION,
    FORWARDED_ANNOTATION,
    NETWORK_POLICY_ANNOTATION,
];

/// The Pod's [`NETWORK_POLICY_ANNOTATION`] (`InvalidNetworkPolicy`): `Unmanaged` when absent
/// (a workload opted in by label keeps the policies it has; closing ports it never declared
/// could cut what serves it), spelled as a ModelDeployment's `spec.networkPolicy`.
fn network_policy(
    annotations: &BTreeMap<String, String>,
) -> Result<EngineNetworkPolicy, PodRefusal> {
    match annotations
        .get(NETWORK_POLICY_ANNOTATION)
        .map(String::as_str)
    {
        None | Some("Unmanaged") => Ok(EngineNetworkPolicy::Unmanaged),
        Some("DeclaredPorts") => Ok(EngineNetworkPolicy::DeclaredPorts),
        Some(other) => Err(refuse(
            "InvalidNetworkPolicy",
            format!(
                "{NETWORK_POLICY_ANNOTATION} {other:?} is not DeclaredPorts or Unmanaged (the spelling is exact): DeclaredPorts closes the Pod but for the ports its containers declare (docs/isolation.md#engine-pods)"
            ),
        )),
    }
}

/// The annotation contract (`UnknownAnnotation`, `RecordSubmitted`, `DomainAnnotation`;
/// docs/design.md#injection-contract).
fn annotation_keys(annotations: &BTreeMap<String, String>) -> Result<(), PodRefusal> {
    for key in annotations.keys().filter(|k| k.starts_with(PREFIX)) {
        if key == CLIENT_CONFIG_ANNOTATION || key == INJECTED_ANNOTATION {
            return Err(refuse(
                "RecordSubmitted",
                format!(
                    "{key} is written by the injection webhook and cannot be submitted: remove it from the Pod template"
                ),
            ));
        }
        if key == "kvcache.gpustack.ai/domain" {
            return Err(refuse(
                "DomainAnnotation",
                "kvcache.gpustack.ai/domain does not exist: the domain is the Binding's spec.domain.name; name another Binding for another domain",
            ));
        }
        if !ACCEPTED.contains(&key.as_str()) {
            return Err(refuse(
                "UnknownAnnotation",
                format!(
                    "{key} is not a kvcache.gpustack.ai annotation (known: {}); check the spelling",
                    ACCEPTED.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The engine annotation (`EngineMissing`, `InvalidEngine`): required, never guessed.
fn engine(annotations: &BTreeMap<String, String>) -> Result<EngineName, PodRefusal> {
    match annotations.get(ENGINE_ANNOTATION).map(String::as_str) {
        Some("vLLM") => Ok(EngineName::Vllm),
        Some("SGLang") => Ok(EngineName::Sglang),
        Some(other) => Err(refuse(
            "InvalidEngine",
            format!("{ENGINE_ANNOTATION} {other:?} is not vLLM or SGLang (the spelling is exact)"),
        )),
        None => Err(refuse(
            "EngineMissing",
            format!(
                "{ENGINE_ANNOTATION} is required (vLLM or SGLang): the engine is never guessed from the image"
            ),
        )),
    }
}

/// The container to inject (`ContainerAmbiguous`, `InitContainerNamed`, `ContainerNotFound`).
fn container_index(pod: &Pod, annotations: &BTreeMap<String, String>) -> Result<usize, PodRefusal> {
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    match annotations.get(CONTAINER_ANNOTATION) {
        Some(name) => {
            if let Some(i) = containers.iter().position(|c| &c.name == name) {
                return Ok(i);
            }
            let init = spec
                .and_then(|s| s.init_containers.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| &c.name == name));
            if init {
                Err(refuse(
                    "InitContainerNamed",
                    format!(
                        "{CONTAINER_ANNOTATION} names init container {name:?}, which runs before the engine and would cache nothing: name the engine's container"
                    ),
                ))
            } else {
                Err(refuse(
                    "ContainerNotFound",
                    format!(
                        "{CONTAINER_ANNOTATION} names {name:?}, which is not a container of this Pod"
                    ),
                ))
            }
        }
        None if containers.len() == 1 => Ok(0),
        None => Err(refuse(
            "ContainerAmbiguous",
            format!(
                "the Pod has {} containers and no {CONTAINER_ANNOTATION}: name the engine's container (the first is never chosen)",
                containers.len()
            ),
        )),
    }
}

/// The pool's ledger as its `QuotaLedgerAvailable` condition reports it (`LedgerNotReady`;
/// docs/design.md#injection-ledger).
fn ledger(pool: &KVCachePool) -> Ledger {
    let c = pool.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == QUOTA_LEDGER_AVAILABLE)
    });
    match c {
        Some(c) if c.status == "True" => Ledger::Enforced,
        Some(c) if c.status == "False" && c.reason == "MultiTenancyDisabled" => Ledger::Absent,
        Some(c) => Ledger::Unavailable(format!(
            "{QUOTA_LEDGER_AVAILABLE}={}/{}: {}",
            c.status, c.reason, c.message
        )),
        None => Ledger::Unavailable(format!("{QUOTA_LEDGER_AVAILABLE} is not reported yet")),
    }
}

/// The Binding a Pod names through `BINDING_ANNOTATION`, when it names one.
pub fn binding_named(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(BINDING_ANNOTATION))
        .map(String::as_str)
        .filter(|b| !b.is_empty())
}

/// The Pod's own engine policy (`InvalidNetworkPolicy`, `RecordSubmitted`): what its
/// [`NETWORK_POLICY_ANNOTATION`] asks for, and the token naming that policy (from `request`, the
/// admission request's uid).
fn own_policy(
    pod: &Pod,
    annotations: &BTreeMap<String, String>,
    request: &str,
) -> Result<(EngineNetworkPolicy, String), PodRefusal> {
    let policy = network_policy(annotations)?;
    if pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(ENGINE_POLICY_LABEL))
    {
        return Err(refuse(
            "RecordSubmitted",
            format!(
                "metadata.labels[{ENGINE_POLICY_LABEL}] is written by the injection webhook and cannot be submitted (it names a Pod's own NetworkPolicy): remove it from the Pod template and set {NETWORK_POLICY_ANNOTATION}: DeclaredPorts instead"
            ),
        ));
    }
    let token = policy_token(request);
    if policy == EngineNetworkPolicy::DeclaredPorts && token.is_empty() {
        return Err(refuse(
            "InvalidNetworkPolicy",
            format!(
                "the admission request carries no uid to name the Pod's own NetworkPolicy by, so {NETWORK_POLICY_ANNOTATION}: DeclaredPorts cannot be honoured; retry the creation"
            ),
        ));
    }
    Ok((policy, token))
}

/// The attachment the Binding `binding` of `namespace` gives (`BindingNotFound`,
/// `BindingDeleting`, `DanglingReference`): its chain as the webhook found it (`refs`), the
/// ledger and endpoint as its pool observed them.
fn attach(
    refs: Chain<'_>,
    namespace: &str,
    binding: &str,
    env: &Environment<'_>,
) -> Result<Attachment, PodRefusal> {
    if refs
        .binding
        .is_some_and(|b| b.metadata.deletion_timestamp.is_some())
    {
        return Err(refuse(
            "BindingDeleting",
            format!(
                "KVCachePoolBinding {namespace}/{binding} is being deleted: its namespace no longer reaches the store and its tenant is revoked on the master (docs/isolation.md#revocation); name another Binding of this namespace"
            ),
        ));
    }
    let links = refs.links(namespace, binding).map_err(|link| match link {
        MissingLink::Binding { .. } => refuse(
            "BindingNotFound",
            format!(
                "{link}: create it in this namespace, or name one that exists (kubectl get kvcachepoolbindings -n {namespace})"
            ),
        ),
        _ => refuse("DanglingReference", link.to_string()),
    })?;
    let mut att = attachment_on(binding, links.binding, links.backend, env)
        .map_err(|e| refuse("DanglingReference", e.to_string()))?;
    // The pool's observations, not the declarations, decide (docs/design.md#injection-ledger).
    att.ledger = ledger(links.pool);
    att.client_endpoint = links
        .pool
        .status
        .as_ref()
        .and_then(|s| s.client_endpoint.clone());
    Ok(att)
}

/// `pod` with the injection applied to its container `index`, its records written and, for
/// `DeclaredPorts`, the label naming its own policy (`token`).
fn injected(
    pod: &Pod,
    index: usize,
    injection: &kvcache_inject::Injection,
    policy: EngineNetworkPolicy,
    token: String,
) -> Pod {
    let mut out = pod.clone();
    let out_spec = out.spec.get_or_insert_with(Default::default);
    out_spec.containers[index] = injection.apply(&out_spec.containers[index]);
    if let Some(v) = &injection.volume {
        out_spec
            .volumes
            .get_or_insert_with(Vec::new)
            .push(v.clone());
    }
    let a = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if let Some(doc) = &injection.client_config {
        a.insert(CLIENT_CONFIG_ANNOTATION.to_owned(), doc.clone());
    }
    a.insert(INJECTED_ANNOTATION.to_owned(), injection.record_json());
    if policy == EngineNetworkPolicy::DeclaredPorts {
        out.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(ENGINE_POLICY_LABEL.to_owned(), token);
    }
    out
}

/// Decides for one opted-in Pod in `namespace`; `request` is the admission request's uid, the
/// Pod's own engine policy's name when it asks for one (`NETWORK_POLICY_ANNOTATION`).
pub fn inject_pod(
    pod: &Pod,
    namespace: &str,
    request: &str,
    refs: Chain<'_>,
    env: &Environment<'_>,
) -> Result<Injected, PodRefusal> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotation_keys(&annotations)?;
    let (policy, token) = own_policy(pod, &annotations, request)?;
    let binding_name = annotations
        .get(BINDING_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default();
    let engine_name = engine(&annotations)?;
    let row = engines::row(
        engine_name,
        annotations.get(MANUFACTURER_ANNOTATION).map(String::as_str),
    )
    .map_err(|e| refuse(e.reason(), e.to_string()))?;
    let role = parse_role(annotations.get(ROLE_ANNOTATION).map(String::as_str))
        .map_err(|e| refuse(e.reason(), e.to_string()))?;
    let index = container_index(pod, &annotations)?;
    // The binding annotation's own shape (missing, another namespace) is kvcache-inject's;
    // only look it up when it names something here.
    let attachment = if binding_name.is_empty() || binding_name.contains('/') {
        None
    } else {
        Some(attach(refs, namespace, binding_name, env)?)
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let container = &spec.containers[index];
    let volumes: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    let empty = String::new();
    let req = Request {
        source: Source::Webhook,
        engine: row,
        role,
        binding: binding_name,
        domain: attachment.as_ref().map_or(&empty, |a| &a.domain),
        ledger: attachment
            .as_ref()
            .map_or(Ledger::Absent, |a| a.ledger.clone()),
        dtype: attachment.as_ref().map_or(&empty, |a| &a.dtype),
        dtype_owned: env.settings.kv_cache_dtype_owned,
        client_endpoint: attachment
            .as_ref()
            .and_then(|a| a.client_endpoint.as_deref()),
        protocols: attachment.as_ref().map_or(&[], |a| a.protocols.as_slice()),
        store_version: attachment.as_ref().and_then(|a| a.store_version.as_deref()),
        engine_version: None,
        container,
        pod_volumes: &volumes,
        launch_args_forwarded: annotations.get(FORWARDED_ANNOTATION).map(String::as_str)
            == Some("true"),
    };
    let injection = inject(&req).map_err(|e| refuse(e.reason(), e.to_string()))?;
    Ok(Injected {
        pod: injected(pod, index, &injection, policy, token),
        warnings: injection.warnings,
    })
}

/// The post-create freeze (docs/design.md#post-create-freeze): on an UPDATE of an opted-in Pod,
/// editing or removing the trigger label or either record annotation is refused; everything else
/// passes.
pub fn frozen_edit(old: &Pod, new: &Pod) -> Option<String> {
    let label = |p: &Pod, k: &str| p.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned();
    let annotation = |p: &Pod, k: &str| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
    };
    if label(old, INJECT_LABEL) != label(new, INJECT_LABEL) {
        return Some(format!(
            "metadata.labels[{INJECT_LABEL}] cannot change on an existing Pod: injection happens at creation; change the Pod template and let the workload roll"
        ));
    }
    if label(old, ENGINE_POLICY_LABEL) != label(new, ENGINE_POLICY_LABEL) {
        return Some(format!(
            "metadata.labels[{ENGINE_POLICY_LABEL}] names the Pod's own NetworkPolicy and cannot be edited or removed (docs/isolation.md#engine-pods)"
        ));
    }
    if annotation(old, NETWORK_POLICY_ANNOTATION) != annotation(new, NETWORK_POLICY_ANNOTATION) {
        return Some(format!(
            "metadata.annotations[{NETWORK_POLICY_ANNOTATION}] is read at creation and cannot change on an existing Pod; change the Pod template and let the workload roll"
        ));
    }
    for k in [INJECTED_ANNOTATION, CLIENT_CONFIG_ANNOTATION] {
        if annotation(old, k) != annotation(new, k) {
            return Some(format!(
                "metadata.annotations[{k}] records the injection and cannot be edited or removed"
            ));
        }
    }
    None
}
