//! The operator's own installation: the CRDs, namespace, account, least-privilege RBAC, the
//! Deployment (two replicas, leader election), its Service, PodDisruptionBudget and the webhook
//! configurations. `cargo xtask manifests` writes it to `deploy/operator.yaml`.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, MutatingWebhook, MutatingWebhookConfiguration,
    NamedRuleWithOperations, RuleWithOperations, ServiceReference, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, ValidatingWebhook, ValidatingWebhookConfiguration, Validation,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

const NAME: &str = "kvcache-operator";
/// The Secret holding the webhook's serving pair and CA certificate (`kvcache-operator run
/// --webhook-secret`'s default).
pub const WEBHOOK_SECRET: &str = "kvcache-operator-webhook-tls";
/// The Secret holding the webhook's CA and its key, apart from the serving pair
/// (`kvcache-operator run --webhook-ca-secret`'s default).
pub const WEBHOOK_CA_SECRET: &str = "kvcache-operator-webhook-ca";
/// The webhook server's port in the operator Pod.
pub(crate) const WEBHOOK_PORT: i32 = 9443;
/// Metrics and health.
pub(crate) const METRICS_PORT: i32 = 8080;

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), NAME.into()),
        ("app.kubernetes.io/component".into(), "operator".into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "kvcache-operator".into(),
        ),
    ])
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_owned),
        labels: Some(labels()),
        ..Default::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

fn role_ref(kind: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: NAME.into(),
    }
}

/// What the operator does with the objects it renders: applies them server-side (`patch`; the
/// API server also asks for `create` when the apply makes the object), reads and watches them,
/// and sweeps those it no longer renders.
const APPLIED: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// Every object of the installation, as YAML documents in apply order, with the default
/// [`Access`] (what `deploy/operator.yaml` holds).
pub fn operator(
    namespace: &str,
    image: &str,
) -> Result<Vec<serde_yaml::Value>, crate::error::Error> {
    operator_with_access(namespace, image, &Access::default())
}

/// Every object of the installation, as YAML documents in apply order, its NetworkPolicy
/// admitting what `access` names.
pub fn operator_with_access(
    namespace: &str,
    image: &str,
    access: &Access,
) -> Result<Vec<serde_yaml::Value>, crate::error::Error> {
    let ns = Some(namespace);
    let mut docs = Vec::new();
    // The CRDs first: everything else may name their kinds.
    for crd in kvcache_api::crd::all() {
        push(&mut docs, &crd)?;
    }
    push(&mut docs, &namespace_object(namespace))?;
    push(
        &mut docs,
        &ServiceAccount {
            metadata: meta(NAME, ns),
            ..Default::default()
        },
    )?;
    push(&mut docs, &cluster_role())?;
    push(
        &mut docs,
        &ClusterRoleBinding {
            metadata: meta(NAME, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(vec![subject(namespace)]),
        },
    )?;
    push(&mut docs, &namespace_role(namespace))?;
    push(
        &mut docs,
        &RoleBinding {
            metadata: meta(NAME, ns),
            role_ref: role_ref("Role"),
            subjects: Some(vec![subject(namespace)]),
        },
    )?;
    push(&mut docs, &deployment(namespace, image, access))?;
    push(&mut docs, &service(namespace))?;
    push(&mut docs, &disruption_budget(namespace))?;
    push(&mut docs, &network_policy(namespace, access))?;
    let (mutating, validating) = webhooks(namespace);
    push(&mut docs, &validating)?;
    push(&mut docs, &mutating)?;
    let (policy, binding) = webhook_guard(namespace);
    push(&mut docs, &policy)?;
    push(&mut docs, &binding)?;
    Ok(docs)
}

/// The fields of a webhook that the operator's account must leave as they are (every field but
/// `clientConfig.caBundle`, whose `url` and `service` are compared apart).
const WEBHOOK_FIELDS_KEPT: &[&str] = &[
    "rules",
    "failurePolicy",
    "matchPolicy",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
    "admissionReviewVersions",
    "matchConditions",
    "reinvocationPolicy",
];

/// The CEL that holds when an update of a webhook configuration changed nothing but the
/// webhooks' `caBundle`: the same webhooks by name, each with every other field as it was, and
/// the same labels and annotations.
pub fn ca_bundle_only_expression() -> String {
    let same: Vec<String> = WEBHOOK_FIELDS_KEPT
        .iter()
        .map(|f| format!("o.?{f} == w.?{f}"))
        .collect();
    format!(
        "object.metadata.?labels == oldObject.metadata.?labels \
         && object.metadata.?annotations == oldObject.metadata.?annotations \
         && object.?webhooks.orValue([]).size() == oldObject.?webhooks.orValue([]).size() \
         && object.?webhooks.orValue([]).all(w, oldObject.?webhooks.orValue([]).exists(o, \
         o.name == w.name \
         && o.clientConfig.?url == w.clientConfig.?url \
         && o.clientConfig.?service == w.clientConfig.?service \
         && {}))",
        same.join(" && ")
    )
}

/// A ValidatingAdmissionPolicy and its binding that let the operator's account change nothing
/// in a webhook configuration but `caBundle`: RBAC can limit it to its own two configurations
/// and to `update`, not to one field, and an account that could rewrite their rules or failure
/// policy could switch the admission checks off.
fn webhook_guard(namespace: &str) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let name = format!("{NAME}-webhook-ca-bundle-only");
    let account = format!("system:serviceaccount:{namespace}:{NAME}");
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(&name, None),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["admissionregistration.k8s.io".into()]),
                    api_versions: Some(vec!["*".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec![
                        "validatingwebhookconfigurations".into(),
                        "mutatingwebhookconfigurations".into(),
                    ]),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "the-operators-account".into(),
                expression: format!("request.userInfo.username == '{account}'"),
            }]),
            validations: Some(vec![Validation {
                expression: ca_bundle_only_expression(),
                message: Some(format!(
                    "{account} may change only the caBundle of a webhook configuration"
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(&name, None),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(name.clone()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// Appends one object as a YAML document (k8s-openapi writes its apiVersion and kind itself).
fn push<T: Serialize + k8s_openapi::Resource>(
    docs: &mut Vec<serde_yaml::Value>,
    o: &T,
) -> Result<(), crate::error::Error> {
    let v = serde_yaml::to_value(o).map_err(|e| crate::error::Error::Yaml {
        object: T::KIND.to_owned(),
        message: e.to_string(),
    })?;
    docs.push(v);
    Ok(())
}

/// The operator's own account, which both role bindings grant.
fn subject(namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// The namespace. It (and the CRDs) carry no `component: operator` label: the uninstall
/// (`kubectl delete -f deploy/operator.yaml -l app.kubernetes.io/component=operator`) keeps
/// them, and with them every object and the store workloads in the namespace.
fn namespace_object(namespace: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.into()),
            // The store Pods meet the restricted Pod Security Standard but for a fabric
            // group's host network and a disk tier's host folder (docs/isolation.md
            // #pod-security): warned and audited here; a cluster with neither sets `enforce`.
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".into(),
                    "kvcache-operator".into(),
                ),
                (
                    "pod-security.kubernetes.io/warn".into(),
                    "restricted".into(),
                ),
                (
                    "pod-security.kubernetes.io/audit".into(),
                    "restricted".into(),
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Cluster-wide rights: its own kinds, what the injection and admission read, events.
fn cluster_role() -> ClusterRole {
    let group = kvcache_api::GROUP;
    ClusterRole {
        metadata: meta(NAME, None),
        rules: Some(vec![
            // Our kinds: cached (list, watch), read live by the webhook (get), the release
            // finalizer added and removed (patch); never created or replaced.
            rule(
                &[group],
                &["kvcachebackends", "kvcachepools", "kvcachepoolbindings"],
                &["get", "list", "watch", "patch"],
            ),
            // A ModelDeployment carries no finalizer of ours: read only.
            rule(&[group], &["modeldeployments"], &["list", "watch"]),
            rule(&[group], &["instancetypes"], &["get", "list", "watch"]),
            // One writer per status, by patch.
            rule(
                &[group],
                &[
                    "kvcachebackends/status",
                    "kvcachepools/status",
                    "kvcachepoolbindings/status",
                    "modeldeployments/status",
                ],
                &["patch"],
            ),
            // What it renders blocks its owner's deletion (a backend's store objects, a
            // ModelDeployment's Deployments and Service): where the API server enforces owner
            // references (OwnerReferencesPermissionEnforcement) that takes `update` on the
            // owner's finalizers.
            rule(
                &[group],
                &["kvcachebackends/finalizers", "modeldeployments/finalizers"],
                &["update"],
            ),
            // A ModelDeployment's engines run in its own namespace, whichever that is: their
            // Deployments and Service are applied, read, swept and watched there (README.md
            // #what-the-operator-may-do).
            rule(&["apps"], &["deployments"], APPLIED),
            // Services are read and swept, never watched.
            rule(
                &[""],
                &["services"],
                &["get", "list", "create", "patch", "delete"],
            ),
            // Who may reach a store (docs/isolation.md), in its own namespace, and a
            // ModelDeployment's engines, in theirs (docs/isolation.md#engine-pods): read, applied
            // and swept, never watched.
            rule(
                &["networking.k8s.io"],
                &["networkpolicies"],
                &["get", "list", "create", "patch", "delete"],
            ),
            // Its engines' Pods (their metrics and readiness) and the store's, listed and
            // watched.
            rule(&[""], &["pods"], &["list", "watch"]),
            // A ModelDeployment's engine Pods are those of its own Deployments' ReplicaSets
            // (ownership, not labels, chooses the Pods whose metrics it reads): listed.
            rule(&["apps"], &["replicasets"], &["list"]),
            // Events about our objects, where they live (a repeat patches its series).
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
            // At start: are the CRDs installed?
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &["get"],
            ),
            // Its own two webhook configurations only, to keep their caBundle (the watch
            // names them with a field selector, which resourceNames allows); the
            // ValidatingAdmissionPolicy below lets it change nothing else in them.
            PolicyRule {
                resource_names: Some(vec![NAME.into()]),
                ..rule(
                    &["admissionregistration.k8s.io"],
                    &[
                        "validatingwebhookconfigurations",
                        "mutatingwebhookconfigurations",
                    ],
                    &["get", "list", "watch", "update"],
                )
            },
        ]),
        ..Default::default()
    }
}

/// Rights in its own namespace only: the store workloads and what their Pods are granted (a
/// Role can only grant what its creator holds).
fn namespace_role(namespace: &str) -> Role {
    Role {
        metadata: meta(NAME, Some(namespace)),
        rules: Some(vec![
            // Member DaemonSets, and the etcd StatefulSet of a backend with warm failover:
            // applied, watched (their readiness is in the status) and swept.
            rule(
                &["apps"],
                &["daemonsets", "statefulsets"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            // The settings ConfigMap is watched; the tenant policy's is applied and swept.
            rule(
                &[""],
                &["configmaps"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            // The elector's account: applied and swept (the store's NetworkPolicies are the
            // ClusterRole's).
            rule(
                &[""],
                &["serviceaccounts"],
                &["list", "create", "patch", "delete"],
            ),
            // Member Pods whose template changed are deleted (DaemonSets are OnDelete), a drain
            // recorded on each first (docs/design.md#member-rollout); a backend's isolation
            // probe Pod is created and deleted once read (docs/isolation.md#enforcement-checked);
            // reading them is the ClusterRole's.
            rule(&[""], &["pods"], &["create", "patch", "delete"]),
            // The leader Service's endpoints tell when the serving leader moves.
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["list", "watch"],
            ),
            // The store Leases (made once, then the electors' own; swept with their backend)
            // and the operator's own (campaigned for: read, created, renewed). `update` is the
            // electors': a Role can grant only what its creator holds.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            // The webhook's serving pair and its CA (two Secrets, made on first start): those
            // alone, by name (the watch selects the serving one by `metadata.name`); a create
            // cannot be limited by name, so it is a rule of its own.
            PolicyRule {
                resource_names: Some(vec![
                    WEBHOOK_SECRET.to_owned(),
                    WEBHOOK_CA_SECRET.to_owned(),
                ]),
                ..rule(&[""], &["secrets"], &["get", "list", "watch", "update"])
            },
            rule(&[""], &["secrets"], &["create"]),
            // The elector's rights, granted to its account (a Role can only grant what its
            // creator holds: Leases above).
            rule(
                &["rbac.authorization.k8s.io"],
                &["roles", "rolebindings"],
                &["list", "create", "patch", "delete"],
            ),
        ]),
    }
}

/// The operator Deployment: two replicas, one runs the controllers while holding the Lease
/// `kvcache-operator`, the other stands by and takes over when it is released.
fn deployment(namespace: &str, image: &str, access: &Access) -> Deployment {
    Deployment {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(pod_spec(image, access)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The operator Pod: restricted, spread over two nodes where there are two.
fn pod_spec(image: &str, access: &Access) -> PodSpec {
    PodSpec {
        service_account_name: Some(NAME.into()),
        // The restricted Pod Security Standard: non-root, no privilege escalation, every
        // capability dropped, the runtime's seccomp profile, a read-only root filesystem (the
        // operator writes nothing locally).
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        // SIGTERM: the leader releases its Lease, in-flight reconciles and webhook requests
        // drain, all well within this.
        termination_grace_period_seconds: Some(30),
        // The two replicas on different nodes where there are two.
        affinity: Some(crate::names::prefer_separate_nodes(selector_labels())),
        containers: vec![operator_container(image, access)],
        ..Default::default()
    }
}

/// The operator container: `run` with leader election, the webhook and metrics ports (the
/// webhook serving the control plane's addresses alone when `access` names them), probes on
/// `/readyz` and `/healthz`, a read-only root filesystem.
fn operator_container(image: &str, access: &Access) -> Container {
    let mut args = vec![
        "run".into(),
        "--leader-elect".into(),
        format!("--webhook-addr=0.0.0.0:{WEBHOOK_PORT}"),
        format!("--metrics-addr=0.0.0.0:{METRICS_PORT}"),
        // One JSON object a line, each with the reconcile's span (controller, namespace, name,
        // trace_id).
        "--log-format=json".into(),
    ];
    // The server itself closes other sources' connections too: where nothing enforces the
    // NetworkPolicy, no other Pod sends reviews or holds the webhook's connections.
    if !access.control_plane.is_empty() {
        args.push(format!(
            "--webhook-allowed-source={}",
            access.control_plane.join(",")
        ));
    }
    Container {
        name: "operator".into(),
        image: Some(image.into()),
        args: Some(args),
        env: Some(vec![
            field_env("KVCACHE_NAMESPACE", "metadata.namespace"),
            // The replica's identity in the Lease and in events.
            field_env("POD_NAME", "metadata.name"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("webhook".into()),
                container_port: WEBHOOK_PORT,
                ..Default::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: METRICS_PORT,
                ..Default::default()
            },
        ]),
        // Ready once the caches are synced and the webhook certificate is loaded: a standby is
        // ready too (it serves webhooks).
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        liveness_probe: Some(http_probe("/healthz", 20, 3)),
        resources: Some(default_resources()),
        // The store containers' restricted settings, the same for the operator.
        security_context: Some(crate::backend::restricted_container()),
        ..Default::default()
    }
}

/// Who may connect to the operator's Pods, as set at install (Helm `controlPlaneCIDRs` and
/// `metricsFrom`; `cargo xtask manifests --control-plane-cidrs --metrics-from`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The address blocks the API server's calls come from (the control plane's addresses, as
    /// the operator's Pods see them). Empty: not known, and the webhook port stays open to
    /// every source, since no NetworkPolicy can name an API server on a host's network in
    /// general (docs/isolation.md#the-operators-own-pods says what to set per CNI).
    pub control_plane: Vec<String>,
    /// The namespaces whose Pods may read `/metrics` (Prometheus's).
    pub metrics_from: Vec<String>,
}

/// The namespace whose Pods may read the operator's `/metrics` when the install names none:
/// where kube-prometheus and the prometheus-operator's guides run Prometheus.
pub const DEFAULT_METRICS_NAMESPACE: &str = "monitoring";

impl Default for Access {
    fn default() -> Self {
        Access {
            control_plane: Vec::new(),
            metrics_from: vec![DEFAULT_METRICS_NAMESPACE.to_owned()],
        }
    }
}

/// One source a port admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An address block (`ipBlock.cidr`).
    Block(String),
    /// Every Pod of a namespace, by its `kubernetes.io/metadata.name` label.
    Namespace(String),
}

/// Who may connect to one port of the operator's Pods. Connections from the Pod's own node
/// (the kubelet's probes) are not a NetworkPolicy's to refuse in the common enforcers
/// (kube-router, Calico, Cilium), so neither variant needs to name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sources {
    /// Every source.
    Anyone,
    /// These sources alone; none: nothing but the Pod's own node.
    Only(Vec<Source>),
}

/// Which sources each port of the operator's Pods admits: the webhook port the control plane
/// (everyone when its addresses are not known); the metrics port the control plane (the API
/// server's Pod proxy, for whoever RBAC lets use it) and the Pods of the monitoring namespaces.
pub fn admitted(access: &Access) -> Vec<(i32, Sources)> {
    let control_plane = access
        .control_plane
        .iter()
        .map(|c| Source::Block(c.clone()));
    let webhook = if access.control_plane.is_empty() {
        Sources::Anyone
    } else {
        Sources::Only(control_plane.clone().collect())
    };
    let metrics = Sources::Only(
        control_plane
            .chain(
                access
                    .metrics_from
                    .iter()
                    .map(|n| Source::Namespace(n.clone())),
            )
            .collect(),
    );
    vec![(WEBHOOK_PORT, webhook), (METRICS_PORT, metrics)]
}

/// The operator's own Pods take connections on the webhook port and the metrics port alone,
/// each from the sources [`admitted`] names. A port that admits nobody has no rule (a rule
/// with no `from` would admit everyone).
fn network_policy(
    namespace: &str,
    access: &Access,
) -> k8s_openapi::api::networking::v1::NetworkPolicy {
    use k8s_openapi::api::networking::v1::{
        IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
        NetworkPolicySpec,
    };
    let peer = |s: Source| match s {
        Source::Block(cidr) => NetworkPolicyPeer {
            ip_block: Some(IPBlock { cidr, except: None }),
            ..Default::default()
        },
        Source::Namespace(name) => NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    name,
                )])),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    let ingress = admitted(access)
        .into_iter()
        .filter_map(|(port, sources)| {
            let from = match sources {
                Sources::Anyone => None,
                Sources::Only(s) if s.is_empty() => return None,
                Sources::Only(s) => Some(s.into_iter().map(peer).collect()),
            };
            Some(NetworkPolicyIngressRule {
                from,
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(port)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            })
        })
        .collect();
    NetworkPolicy {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    }
}

/// The operator's Service: the webhook on 443, metrics on their own port.
fn service(namespace: &str) -> Service {
    Service {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels()),
            ports: Some(vec![
                ServicePort {
                    name: Some("webhook".into()),
                    port: 443,
                    target_port: Some(IntOrString::String("webhook".into())),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("metrics".into()),
                    port: METRICS_PORT,
                    target_port: Some(IntOrString::String("metrics".into())),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A drain never takes both replicas at once.
fn disruption_budget(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The operator container's CPU request. At 50m (a CPU weight of 51 against an engine's
/// hundreds) the leader missed its Lease renewals while engines prefilled on every core
/// (`lost the operator's Lease kvcache-operator while leading`, seen in `cargo xtask demo`).
pub(crate) const OPERATOR_CPU_REQUEST: &str = "200m";

/// The operator container's requests and limits.
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(OPERATOR_CPU_REQUEST.into())),
            ("memory".to_owned(), Quantity("64Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("256Mi".into()),
        )])),
        ..Default::default()
    }
}

/// The labels the Deployment selects its Pods by.
fn selector_labels() -> BTreeMap<String, String> {
    labels()
        .into_iter()
        .filter(|(k, _)| k != "app.kubernetes.io/managed-by")
        .collect()
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        }),
        value: None,
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The webhook configurations (the Pod injection, the validation of our kinds, the Pod
/// annotation freeze), addressed to the operator's Service; the operator writes their
/// `caBundle`. Until a replica serves, writes of our kinds and of Pods labelled
/// The validating webhook's match condition: every CREATE, and an UPDATE only when the spec
/// changes (none of the kinds' rules read metadata).
pub(crate) const SPEC_CHANGES_ONLY: &str =
    "request.operation != 'UPDATE' || object.spec != oldObject.spec";

/// `kvcache.gpustack.ai/inject: "true"` are refused (they fail closed); nothing else is matched.
pub fn webhooks(namespace: &str) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let client = |path: &str| WebhookClientConfig {
        service: Some(ServiceReference {
            name: NAME.into(),
            namespace: namespace.into(),
            path: Some(path.into()),
            port: Some(443),
        }),
        ..Default::default()
    };
    let ops = |ops: &[&str], groups: &[&str], resources: &[&str]| RuleWithOperations {
        operations: Some(ops.iter().map(|s| (*s).to_owned()).collect()),
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        api_versions: Some(vec!["v1".into()]),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        scope: None,
    };
    let inject_label = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kvcache.gpustack.ai/inject".into(),
            "true".into(),
        )])),
        ..Default::default()
    };
    let mutating = MutatingWebhookConfiguration {
        metadata: meta(NAME, None),
        webhooks: Some(vec![MutatingWebhook {
            name: "inject.kvcache.gpustack.ai".into(),
            client_config: client("/mutate-pods"),
            rules: Some(vec![ops(&["CREATE"], &[""], &["pods"])]),
            object_selector: Some(inject_label.clone()),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["kube-system".into()]),
                }]),
                ..Default::default()
            }),
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(10),
            ..Default::default()
        }]),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: meta(NAME, None),
        webhooks: Some(vec![
            ValidatingWebhook {
                name: "validate.kvcache.gpustack.ai".into(),
                client_config: client("/validate"),
                rules: Some(vec![ops(
                    &["CREATE", "UPDATE"],
                    &[kvcache_api::GROUP],
                    &[
                        "kvcachebackends",
                        "kvcachepools",
                        "kvcachepoolbindings",
                        "modeldeployments",
                        "instancetypes",
                    ],
                )]),
                // Equivalent: a request through another version of these resources (should
                // one be served later) is converted and judged all the same.
                match_policy: Some("Equivalent".into()),
                // Only what the webhook judges is sent to it: an update that leaves the spec
                // alone (a finalizer removed, a label or annotation) never waits on a stopped
                // operator, so a namespace deletion or a stuck object can always finish.
                match_conditions: Some(vec![MatchCondition {
                    name: "spec-changes-only".into(),
                    expression: SPEC_CHANGES_ONLY.into(),
                }]),
                failure_policy: Some("Fail".into()),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                timeout_seconds: Some(10),
                ..Default::default()
            },
            ValidatingWebhook {
                name: "freeze.kvcache.gpustack.ai".into(),
                client_config: client("/validate-pods"),
                rules: Some(vec![ops(&["UPDATE"], &[""], &["pods"])]),
                object_selector: Some(inject_label),
                failure_policy: Some("Ignore".into()),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                timeout_seconds: Some(5),
                ..Default::default()
            },
        ]),
    };
    (mutating, validating)
}

/// The installation as one YAML stream with a header (`deploy/operator.yaml`).
pub fn operator_yaml(namespace: &str, image: &str) -> Result<String, crate::error::Error> {
    operator_yaml_with_access(namespace, image, &Access::default())
}

/// The installation as one YAML stream with a header, its NetworkPolicy admitting what
/// `access` names and a comment above it saying so.
pub fn operator_yaml_with_access(
    namespace: &str,
    image: &str,
    access: &Access,
) -> Result<String, crate::error::Error> {
    let body = operator_with_access(namespace, image, access)?
        .iter()
        .map(|doc| {
            let text = serde_yaml::to_string(doc)?;
            Ok(if doc["kind"].as_str() == Some("NetworkPolicy") {
                format!("{}{text}", policy_comment(access))
            } else {
                text
            })
        })
        .collect::<Result<Vec<String>, serde_yaml::Error>>()
        .map_err(|e| crate::error::Error::Yaml {
            object: "the installation".into(),
            message: e.to_string(),
        })?;
    Ok(format!(
        "# Generated by `cargo xtask manifests` from crates/kvcache-render; do not edit.\n# Install: kubectl apply -f deploy/operator.yaml (README: Install).\n{}",
        body.join("---\n")
    ))
}

/// What the operator's NetworkPolicy admits, as comment lines above it.
fn policy_comment(access: &Access) -> String {
    let webhook = if access.control_plane.is_empty() {
        format!(
            "The webhook port ({WEBHOOK_PORT}) admits every source: the control plane's addresses were not given. Name them where your CNI shows the API server's address to a NetworkPolicy (Helm controlPlaneCIDRs, `cargo xtask manifests --control-plane-cidrs`; docs/isolation.md#the-operators-own-pods says what to set per CNI)."
        )
    } else {
        format!(
            "The webhook port ({WEBHOOK_PORT}) admits the control plane alone: {}.",
            access.control_plane.join(", ")
        )
    };
    let mut from = vec!["the Pod's own node (the probes)".to_owned()];
    if !access.control_plane.is_empty() {
        from.push("the control plane (the API server's Pod proxy)".to_owned());
    }
    if !access.metrics_from.is_empty() {
        from.push(format!(
            "the Pods of the namespaces {} (Helm metricsFrom, `--metrics-from`)",
            access.metrics_from.join(", ")
        ));
    }
    let metrics = match from.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!(
            "The metrics port ({METRICS_PORT}) admits {} and {last} alone.",
            rest.join(", ")
        ),
        _ => format!(
            "The metrics port ({METRICS_PORT}) admits {} alone.",
            from.join("")
        ),
    };
    let mut out = String::new();
    for paragraph in [webhook, metrics] {
        let mut line = String::from("#");
        for word in paragraph.split(' ') {
            if line.len() + 1 + word.len() > 96 && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

const HELM_NAMESPACE: &str = "HELM_VALUES_NAMESPACE";
const HELM_IMAGE: &str = "HELM_VALUES_IMAGE";
const HELM_RESOURCES: &str = "HELM_VALUES_RESOURCES";
const HELM_INGRESS: &str = "HELM_VALUES_INGRESS";

/// The chart's NetworkPolicy rules, under `spec:`: [`admitted`] written in Helm, from the values
/// `controlPlaneCIDRs` and `metricsFrom` (a test renders both ways and compares).
fn helm_ingress() -> String {
    let blocks = "    {{- range .Values.controlPlaneCIDRs }}\n    - ipBlock:\n        cidr: {{ . | quote }}\n    {{- end }}\n";
    let port = |n: i32| format!("    ports:\n    - port: {n}\n      protocol: TCP\n");
    format!(
        "  # The webhook port admits every source unless controlPlaneCIDRs names the control plane;\n  # the metrics port the Pod's own node, the control plane and the Pods of metricsFrom's\n  # namespaces (docs/isolation.md#the-operators-own-pods).\n  ingress:\n  {{{{- if .Values.controlPlaneCIDRs }}}}\n  - from:\n{blocks}{webhook}  {{{{- else }}}}\n  - ports:\n    - port: {WEBHOOK_PORT}\n      protocol: TCP\n  {{{{- end }}}}\n  {{{{- if or .Values.controlPlaneCIDRs .Values.metricsFrom }}}}\n  - from:\n{blocks}    {{{{- range .Values.metricsFrom }}}}\n    - namespaceSelector:\n        matchLabels:\n          kubernetes.io/metadata.name: {{{{ . | quote }}}}\n    {{{{- end }}}}\n{metrics}  {{{{- end }}}}",
        webhook = port(WEBHOOK_PORT),
        metrics = port(METRICS_PORT),
    )
}

/// The Helm chart in `deploy/helm/kvcache-operator`, file by file (path in the chart, text): the
/// same objects as [`operator_yaml`], with values for the image, replicas, resources,
/// namespace, the webhooks (on/off) and a ServiceMonitor (on/off). Rendered with its default
/// values it is `deploy/operator.yaml` (a test runs `helm template` and compares the objects).
pub fn helm_chart(
    namespace: &str,
    image: &str,
) -> Result<Vec<(String, String)>, crate::error::Error> {
    let yaml_err = |what: &str| {
        let what = what.to_owned();
        move |e: serde_yaml::Error| crate::error::Error::Yaml {
            object: what.clone(),
            message: e.to_string(),
        }
    };
    let header =
        "# Generated by `cargo xtask manifests` from crates/kvcache-render; do not edit.\n";
    let mut files = Vec::new();
    let version = env!("CARGO_PKG_VERSION");
    files.push((
        "Chart.yaml".to_owned(),
        format!(
            "{header}apiVersion: v2\nname: kvcache-operator\ndescription: A shared KV cache for LLM inference over the Mooncake store\ntype: application\nversion: {version}\nappVersion: \"{version}\"\n"
        ),
    ));
    let resources = default_resources();
    let values = serde_json::json!({
        "image": image,
        "replicas": 2,
        "namespace": namespace,
        "resources": resources,
        "webhook": {"enabled": true},
        "serviceMonitor": {"enabled": false, "interval": "30s"},
        "prometheusRule": {"enabled": false},
        "storeMetricsFrom": [],
        "controlPlaneCIDRs": [],
        "metricsFrom": [DEFAULT_METRICS_NAMESPACE],
        "isolationProbe": true,
        "unknownSegments": "drain",
    });
    files.push((
        "values.yaml".to_owned(),
        format!(
            "{header}# image: the operator image. Store Pods take the elector from their own image (the kv-cache-elector-image setting), so changing this restarts no store Pod.\n# webhook.enabled: false leaves out the admission webhooks (cross-object rules and Pod injection).\n# serviceMonitor.enabled: a prometheus-operator ServiceMonitor for /metrics.\n# prometheusRule.enabled: the alert rules of deploy/monitoring/ as a prometheus-operator PrometheusRule (docs/troubleshooting.md has each alert's runbook line).\n# storeMetricsFrom: namespaces whose Pods may reach the Mooncake masters' admin port (9003): an explicit grant of the store's admin API (tenant quotas, drain jobs, removals), not needed for metrics, which the operator re-exports on its own /metrics (docs/isolation.md).\n# controlPlaneCIDRs: the address blocks the API server's calls reach the operator's Pods from; set, the webhook port admits those alone (and the metrics port them too, for the API server's Pod proxy); empty, the webhook port admits every source (docs/isolation.md#the-operators-own-pods says what to set per CNI).\n# metricsFrom: namespaces whose Pods (Prometheus) may read the operator's /metrics; the Pod's own node (the probes) always may.\n# isolationProbe: false turns off the check that the store's NetworkPolicies are enforced (one short-lived Pod in this namespace per backend per change of its policies); NetworkIsolated then says Unverified (docs/isolation.md#enforcement-checked).\n# unknownSegments: drain (a segment on a master that no member Pod mounted is drained so that no block lands there) or report (only reported) (docs/isolation.md#unknown-segments).\n{}",
            serde_yaml::to_string(&values).map_err(yaml_err("values"))?
        ),
    ));
    let mut objects = Vec::new();
    for doc in operator(HELM_NAMESPACE, HELM_IMAGE)? {
        let mut doc = doc;
        match doc["kind"].as_str() {
            Some("CustomResourceDefinition") => {
                let name = doc["metadata"]["name"].as_str().unwrap_or("crd").to_owned();
                files.push((
                    format!("crds/{name}.yaml"),
                    serde_yaml::to_string(&doc).map_err(yaml_err("a CRD"))?,
                ));
                continue;
            }
            Some("Deployment") => {
                doc["spec"]["template"]["spec"]["containers"][0]["resources"] =
                    serde_yaml::Value::String(HELM_RESOURCES.into());
            }
            Some("NetworkPolicy") => {
                doc["spec"]["ingress"] = serde_yaml::Value::String(HELM_INGRESS.into());
            }
            _ => {}
        }
        let webhook = matches!(
            doc["kind"].as_str(),
            Some("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration")
        );
        let text = serde_yaml::to_string(&doc).map_err(yaml_err("an object"))?;
        let mut lines = Vec::new();
        for line in text.lines() {
            let line = line
                .replace(HELM_NAMESPACE, "{{ .Values.namespace }}")
                .replace(HELM_IMAGE, "{{ .Values.image }}")
                .replace(HELM_RESOURCES, "{{ toJson .Values.resources }}");
            if line.trim_start() == format!("ingress: {HELM_INGRESS}") {
                lines.push(helm_ingress());
            } else if line.trim_start() == "replicas: 2" {
                lines.push(line.replace("2", "{{ .Values.replicas }}"));
            } else if line.contains("--log-format=json") {
                let indent = &line[..line.len() - line.trim_start().len()];
                lines.push(line.clone());
                lines.push("{{- with .Values.storeMetricsFrom }}".to_owned());
                lines.push(format!(
                    "{indent}- --store-metrics-from={{{{ join \",\" . }}}}"
                ));
                lines.push("{{- end }}".to_owned());
                lines.push("{{- with .Values.controlPlaneCIDRs }}".to_owned());
                lines.push(format!(
                    "{indent}- --webhook-allowed-source={{{{ join \",\" . }}}}"
                ));
                lines.push("{{- end }}".to_owned());
                lines.push("{{- if not .Values.isolationProbe }}".to_owned());
                lines.push(format!("{indent}- --isolation-probe=false"));
                lines.push("{{- end }}".to_owned());
                lines.push("{{- if ne .Values.unknownSegments \"drain\" }}".to_owned());
                lines.push(format!(
                    "{indent}- --unknown-segments={{{{ .Values.unknownSegments }}}}"
                ));
                lines.push("{{- end }}".to_owned());
            } else if line.contains("--webhook-addr=") {
                lines.push("{{- if .Values.webhook.enabled }}".to_owned());
                lines.push(line);
                lines.push("{{- end }}".to_owned());
            } else {
                lines.push(line);
            }
        }
        let body = lines.join("\n");
        objects.push(if webhook {
            format!("{{{{- if .Values.webhook.enabled }}}}\n{body}\n{{{{- end }}}}")
        } else {
            body
        });
    }
    files.push((
        "templates/operator.yaml".to_owned(),
        format!("{header}{}\n", objects.join("\n---\n")),
    ));
    let selector =
        serde_json::to_string(&selector_labels()).map_err(|e| crate::error::Error::Yaml {
            object: "the ServiceMonitor".into(),
            message: e.to_string(),
        })?;
    files.push((
        "templates/servicemonitor.yaml".to_owned(),
        format!(
            "{header}{{{{- if .Values.serviceMonitor.enabled }}}}\napiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: {NAME}\n  namespace: {{{{ .Values.namespace }}}}\n  labels: {labels}\nspec:\n  selector:\n    matchLabels: {selector}\n  endpoints:\n    - port: metrics\n      path: /metrics\n      # The operator's per-Binding series carry the tenant's own namespace label: kept, not\n      # renamed exported_namespace (the alerts and the dashboard read it).\n      honorLabels: true\n      interval: {{{{ .Values.serviceMonitor.interval }}}}\n{{{{- end }}}}\n",
            labels = serde_json::to_string(&labels()).map_err(|e| crate::error::Error::Yaml {
                object: "the ServiceMonitor".into(),
                message: e.to_string(),
            })?,
        ),
    ));
    files.push((
        "templates/prometheusrule.yaml".to_owned(),
        helm_prometheus_rule(header)?,
    ));
    Ok(files)
}

/// The chart's PrometheusRule: `deploy/monitoring/prometheusrule.yaml` in the chart's
/// namespace, behind `prometheusRule.enabled`. The alerts' own templates
/// (`{{ $labels.namespace }}`) are Prometheus's, not Helm's: each brace pair is written as a
/// Helm string that prints it.
fn helm_prometheus_rule(header: &str) -> Result<String, crate::error::Error> {
    let text = serde_yaml::to_string(&crate::monitoring::prometheus_rule(HELM_NAMESPACE)).map_err(
        |e| crate::error::Error::Yaml {
            object: "the PrometheusRule".into(),
            message: e.to_string(),
        },
    )?;
    let (open, close) = ('\u{1}', '\u{2}');
    let text = text
        .replace("{{", &open.to_string())
        .replace("}}", &close.to_string())
        .replace(open, "{{ \"{{\" }}")
        .replace(close, "{{ \"}}\" }}")
        .replace(HELM_NAMESPACE, "{{ .Values.namespace }}");
    Ok(format!(
        "{header}{{{{- if .Values.prometheusRule.enabled }}}}\n{text}{{{{- end }}}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(control_plane: &[&str], metrics_from: &[&str]) -> Access {
        Access {
            control_plane: control_plane.iter().map(|s| (*s).to_owned()).collect(),
            metrics_from: metrics_from.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The policy's rules as (port, peers): `None` for a rule that admits every source.
    fn rules(access: &Access) -> Vec<(i32, Option<Vec<String>>)> {
        let policy = network_policy("gpustack-system", access);
        let spec = policy.spec.expect("a spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
        spec.ingress
            .expect("ingress rules")
            .into_iter()
            .map(|r| {
                let ports = r.ports.expect("every rule names its port");
                assert_eq!(ports.len(), 1, "one port a rule");
                let port = match ports[0].port {
                    Some(IntOrString::Int(n)) => n,
                    ref other => panic!("a numbered port: {other:?}"),
                };
                let peers =
                    r.from.map(|from| {
                        from.into_iter()
                        .map(|p| match (p.ip_block, p.namespace_selector, p.pod_selector) {
                            (Some(b), None, None) => b.cidr,
                            (None, Some(n), None) => format!(
                                "ns:{}",
                                n.match_labels.expect("labels")["kubernetes.io/metadata.name"]
                            ),
                            other => panic!("a block or a namespace: {other:?}"),
                        })
                        .collect()
                    });
                (port, peers)
            })
            .collect()
    }

    #[test]
    fn by_default_the_webhook_is_open_and_metrics_admit_the_monitoring_namespace_alone() {
        assert_eq!(
            admitted(&Access::default()),
            vec![
                (WEBHOOK_PORT, Sources::Anyone),
                (
                    METRICS_PORT,
                    Sources::Only(vec![Source::Namespace("monitoring".into())])
                ),
            ]
        );
        assert_eq!(
            rules(&Access::default()),
            vec![(9443, None), (8080, Some(vec!["ns:monitoring".to_owned()])),]
        );
    }

    #[test]
    fn with_the_control_planes_addresses_the_webhook_admits_them_alone() {
        let a = access(&["10.0.0.0/28", "fd00::/64"], &["monitoring", "ops"]);
        assert_eq!(
            rules(&a),
            vec![
                (9443, Some(vec!["10.0.0.0/28".into(), "fd00::/64".into()])),
                (
                    8080,
                    Some(vec![
                        "10.0.0.0/28".into(),
                        "fd00::/64".into(),
                        "ns:monitoring".into(),
                        "ns:ops".into()
                    ])
                ),
            ]
        );
    }

    #[test]
    fn the_webhook_is_told_the_control_planes_addresses_it_serves() {
        let args = |a: &Access| operator_container("img", a).args.unwrap_or_default();
        assert!(
            args(&access(&["10.0.0.0/28", "fd00::/64"], &[]))
                .contains(&"--webhook-allowed-source=10.0.0.0/28,fd00::/64".to_owned())
        );
        assert!(
            !args(&Access::default())
                .iter()
                .any(|a| a.starts_with("--webhook-allowed-source")),
            "unnamed, every source is served"
        );
    }

    #[test]
    fn a_port_that_admits_nobody_has_no_rule_never_an_open_one() {
        // No monitoring namespace and no control plane: the metrics port takes the node's
        // probes alone, so it has no rule (a rule without `from` would admit everyone).
        assert_eq!(
            admitted(&access(&[], &[])),
            vec![
                (WEBHOOK_PORT, Sources::Anyone),
                (METRICS_PORT, Sources::Only(Vec::new()))
            ]
        );
        assert_eq!(rules(&access(&[], &[])), vec![(9443, None)]);
        // Whatever the settings, only the webhook port may be open to everyone, and only
        // while the control plane is not named.
        for a in [
            access(&[], &[]),
            access(&["10.0.0.1/32"], &[]),
            access(&[], &["monitoring"]),
            access(&["10.0.0.1/32"], &["monitoring"]),
        ] {
            for (port, peers) in rules(&a) {
                if peers.is_none() {
                    assert_eq!(port, WEBHOOK_PORT, "{a:?}");
                    assert!(a.control_plane.is_empty(), "{a:?}");
                }
            }
        }
    }

    #[test]
    fn the_manifest_says_what_its_policy_admits_above_it() {
        let text = operator_yaml("gpustack-system", "img").expect("renders");
        let (before, _) = text
            .split_once("kind: NetworkPolicy")
            .expect("the policy is in the manifest");
        let comment = before.rsplit("---\n").next().unwrap_or_default();
        assert!(
            comment.contains("admits every source") && comment.contains("controlPlaneCIDRs"),
            "{comment}"
        );
        let text = operator_yaml_with_access(
            "gpustack-system",
            "img",
            &access(&["10.0.0.0/28"], &["monitoring"]),
        )
        .expect("renders");
        assert!(
            text.contains("admits the control plane alone: 10.0.0.0/28."),
            "{text}"
        );
    }
}
