//! One pass of the KVCacheBackend controller, decided: from what the pass read of the cluster
//! and the store ([`BackendRead`]), the objects to apply, the member rollout's step per group,
//! the members of other backends to restart, and the observation the status is computed from
//! ([`BackendPlan`]). The operator reads, calls [`plan`], then applies, carries out and writes.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::EndpointName;
use kvcache_api::settings::Settings;
use kvcache_inject::versions::store_version_of_image;
use kvcache_quota::policy;

use crate::error::Error;
use crate::members::maintenance::{self, Leaving};
use crate::members::mounts::{self, OtherMember, UnknownInput, foreign_mounts};
use crate::members::rollout::{GroupFacts, GroupStep, RolloutInput, hold_standbys, member_rollout};
use crate::names::label_value;
use crate::objects::backend::{
    BackendInputs, BackendObjects, StoreAccess, access, client_endpoint, pod_spec_hash, probe,
    render, store_image,
};
use crate::observe::read::{self, MemberPod};
use crate::observe::store::{DrainJob, DrainRequest, ReadError, StoreReading};
use crate::status::backend::Observation;
use crate::world::World;

/// How long a member's drain may run before the member is replaced without it: longer than the
/// master's read lease (`-default_kv_lease_ttl=5m`, crates/kvcache-render/src/objects/backend/leader.rs),
/// during which an object read just before the drain cannot move.
pub(crate) const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// What one pass read for a backend (every read done before anything is decided).
#[derive(Clone, Debug)]
pub struct BackendRead<'a> {
    /// The backend.
    pub backend: &'a KVCacheBackend,
    /// The operator's namespace, where a managed backend's objects live.
    pub namespace: &'a str,
    /// Who besides the backend's Pods and bound namespaces reaches its store.
    pub access: &'a StoreAccess,
    /// The cluster settings in force; `None` when a read was refused and none was read before.
    pub settings: Option<&'a Settings>,
    /// Why the newest settings read was refused, when it was.
    pub settings_refused: Option<String>,
    /// The pools, Bindings and the rest, for the tenant policy, the bound namespaces and
    /// `usedBy`.
    pub world: &'a World,
    /// The backend's live leader Deployment, DaemonSets and etcd StatefulSet (by its owner
    /// label).
    pub deployments: &'a [Deployment],
    /// See `deployments`.
    pub daemon_sets: &'a [DaemonSet],
    /// See `deployments`.
    pub stateful_sets: &'a [StatefulSet],
    /// The backend's leader Lease (read when its leader elects).
    pub lease: Option<&'a Lease>,
    /// Every backend's store Pods in the namespace (another backend's member mounted here is
    /// restarted).
    pub store_pods: &'a [Pod],
    /// The cluster's Nodes: a member on one being taken out of service, or that its group's
    /// edited template no longer admits, is drained first (`crate::members::maintenance`).
    pub nodes: &'a [std::sync::Arc<Node>],
    /// The master's answers, when the backend has an admin address.
    pub store: Option<StoreReading>,
    /// The master's answer about each drain job recorded on a member Pod ([`drain_jobs`]).
    pub jobs: BTreeMap<String, Result<DrainJob, ReadError>>,
    /// The Pod(s) at each address of [`unknown_addresses`] (`crate::members::mounts::pods_named`).
    pub pods_at: &'a BTreeMap<String, String>,
    /// Whether confirmed unknown segments are drained (`--unknown-segments=drain`, the
    /// default) or only reported.
    pub drain_unknown: bool,
    /// The backend's isolation probe Pods (labelled `probe::PROBE_LABEL`).
    pub probe_pods: &'a [Pod],
    /// Whether the operator probes the policies' enforcement (`--isolation-probe`).
    pub probe: bool,
    /// The time of this pass.
    pub now: Timestamp,
}

/// What one pass does for a backend.
#[derive(Clone, Debug)]
pub struct BackendPlan {
    /// The objects to apply (the rest of the backend's is swept); `None`: what runs stays as it
    /// is (no settings, no store image, or an external store).
    pub objects: Option<BackendObjects>,
    /// Whether the tenant policy seed is written (a refused policy keeps the one written).
    pub write_policy: bool,
    /// Each member group's facts (the rollout is decided again from them after a refusal).
    pub groups: Vec<GroupFacts>,
    /// What the status is computed from; `rollout` holds each group's step.
    pub observation: Observation,
    /// The members of other backends mounted on this backend's master, to restart.
    pub foreign: Vec<OtherMember>,
    /// The drains that keep blocks out of unknown segments (`crate::members::mounts::quarantine`).
    pub quarantine: Vec<DrainRequest>,
    /// How soon to read again: to confirm an unknown segment seen within its grace, or to read
    /// a probe's result.
    pub recheck: Option<std::time::Duration>,
    /// A probe Pod to create (`crate::objects::backend::probe::decide`).
    pub probe_create: Option<Pod>,
    /// Probe Pods to delete.
    pub probe_delete: Vec<String>,
    /// The member DaemonSets left as they are this pass: their edited template no longer
    /// admits nodes whose members are still draining (docs/design.md#node-maintenance).
    pub held_groups: Vec<String>,
    /// The serving leader Pod to delete so that a standby takes over before its node goes
    /// (`crate::members::maintenance::leader_handover`).
    pub handover: Option<maintenance::Handover>,
}

impl BackendPlan {
    /// What the pass writes, in order, and the kinds its sweep lists; `None`: what runs stays
    /// as it is.
    pub fn desired(&self) -> Option<crate::objects::desired::DesiredSet> {
        self.objects.as_ref().map(|o| {
            let mut set = o.desired(self.write_policy);
            for name in &self.held_groups {
                set.keep::<DaemonSet>(name);
            }
            set
        })
    }
}

/// The drain jobs recorded on the backend's member Pods, to ask the master about before the
/// rollout is decided.
pub fn drain_jobs(backend: &str, store_pods: &[Pod]) -> Vec<String> {
    members(backend, store_pods)
        .0
        .iter()
        .filter_map(|p| p.drain.as_ref().and_then(|d| d.job.clone()))
        .collect()
}

/// The addresses of the segments a managed backend's master lists that are no member Pod's
/// (`crate::members::mounts::unknown_addresses`): the operator looks up the Pods that have them before
/// [`plan`]. Empty while the listing was not read.
pub fn unknown_addresses(
    backend: &KVCacheBackend,
    store_pods: &[Pod],
    store: Option<&StoreReading>,
) -> std::collections::BTreeSet<String> {
    let name = backend.metadata.name.as_deref().unwrap_or_default();
    match store.map(|s| &s.segments) {
        Some(Ok(segments)) if backend.spec.connection.managed.is_some() => {
            let (own, others) = members(name, store_pods);
            mounts::unknown_addresses(segments, &own, &others)
        }
        _ => Default::default(),
    }
}

/// The backend's own member Pods and the other backends' ones.
fn members(backend: &str, store_pods: &[Pod]) -> (Vec<MemberPod>, Vec<OtherMember>) {
    let own = label_value(backend);
    let (mut mine, mut others) = (Vec::new(), Vec::new());
    for p in store_pods {
        let Some(member) = read::member_pod(p) else {
            continue;
        };
        match p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/instance"))
        {
            Some(instance) if *instance == own => mine.push(member),
            Some(instance) => others.push(OtherMember {
                backend: instance.clone(),
                pod: member,
            }),
            None => {}
        }
    }
    (mine, others)
}

/// The probe of the policies' enforcement (`crate::objects::backend::probe`): what to create and delete,
/// the record to write and what `NetworkIsolated` says.
fn probe_enforcement(
    read: &BackendRead<'_>,
    obs: &mut Observation,
    plan: &mut BackendPlan,
    objects: &BackendObjects,
    image: Option<&str>,
) {
    let name = read.backend.metadata.name.as_deref().unwrap_or_default();
    let policies: Vec<&k8s_openapi::api::networking::v1::NetworkPolicy> = objects
        .network_policies
        .iter()
        .chain(objects.etcd_policy.as_ref())
        .collect();
    let fingerprint = probe::policies_fingerprint(&policies);
    let target = probe::target(name, read.store_pods);
    let pods: Vec<probe::ProbePod> = read.probe_pods.iter().map(probe::read_probe_pod).collect();
    let decision = probe::decide(&probe::ProbeInput {
        enabled: read.probe,
        backend: read.backend,
        namespace: read.namespace,
        bound_namespaces: &obs.bound_namespaces,
        policies: fingerprint.as_deref(),
        target: target.as_deref(),
        image,
        recorded: read
            .backend
            .status
            .as_ref()
            .and_then(|s| s.isolation_probe.as_ref()),
        pods: &pods,
        now: read.now,
    });
    plan.probe_create = decision.create;
    plan.probe_delete = decision.delete;
    plan.recheck = min_some(plan.recheck, decision.recheck);
    obs.isolation = decision.isolation;
    obs.isolation_probe = decision.record;
}

/// The sooner of two optional delays.
fn min_some(
    a: Option<std::time::Duration>,
    b: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    a.into_iter().chain(b).min()
}

/// The unknown segments of a managed backend's serving master (docs/isolation.md#unknown-segments),
/// the drains that keep blocks out of them and when to look again; not judged while no master
/// serves or its listing could not be read (the stored first sightings are kept).
fn judge_segments(read: &BackendRead<'_>, obs: &mut Observation, plan: &mut BackendPlan) {
    let b = read.backend;
    obs.drain_unknown = read.drain_unknown;
    let serving = obs
        .store
        .as_ref()
        .is_some_and(|s| matches!(&s.health, Ok(h) if h.service_ready));
    let Some(Ok(segments)) = obs.store.as_ref().map(|s| &s.segments) else {
        return;
    };
    if b.spec.connection.managed.is_none() || !serving {
        return;
    }
    let previous = b
        .status
        .as_ref()
        .map(|s| s.unknown_segments.as_slice())
        .unwrap_or_default();
    let grace = mounts::grace(b);
    let unknown = mounts::unknown_segments(&UnknownInput {
        segments,
        own: &obs.members,
        others: &obs.other_members,
        pods_at: read.pods_at,
        previous,
        now: read.now,
        grace,
    });
    plan.quarantine = mounts::quarantine(&unknown, segments, &obs.members, read.drain_unknown);
    plan.recheck = min_some(
        plan.recheck,
        mounts::next_confirmation(&unknown, read.now, grace),
    );
    obs.unknown_segments = Some(unknown);
}

/// A warm backend (`electionBackend: Etcd`) whose leader Deployment rolls or whose master does
/// not serve: the next master replays the keys from the etcd, so the member rollout waits
/// rather than replace members undrained (`tests/tests/operator_on_nodes/leader_edits.rs`: an
/// image edit rolled the members while the masters failed over and lost half the keys).
fn leader_unsettled(b: &KVCacheBackend, obs: &Observation) -> bool {
    let warm = b
        .spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.warm());
    let serving = obs
        .store
        .as_ref()
        .is_some_and(|s| matches!(&s.health, Ok(h) if h.service_ready));
    let rolled = obs
        .leader
        .is_some_and(|l| l.observed && l.updated == l.desired && l.total == l.desired);
    warm && !(serving && rolled)
}

/// The member rollout's step per group (docs/design.md#member-rollout), the drains the master
/// refused this pass (`refused`, by Pod) counting as refused.
pub fn rollout(
    read: &BackendRead<'_>,
    observation: &Observation,
    groups: &[GroupFacts],
    refused: &BTreeMap<String, ReadError>,
) -> Vec<GroupStep> {
    member_rollout(&RolloutInput {
        members: &observation.members,
        rendered: &observation.rendered_hashes,
        groups,
        store: observation.store.as_ref(),
        jobs: &read.jobs,
        refused,
        now: read.now,
        deadline: DRAIN_DEADLINE,
        leader_unsettled: leader_unsettled(read.backend, observation),
    })
}

/// A managed backend's objects, as the settings in force render them, held where a live
/// object says so (standbys during the two-step election enablement), with what the status
/// reads of them: the leader's and the etcd's replicas, the fingerprints the member rollout
/// compares, the groups no policy covers, the enforcement probe. Nothing while the settings
/// were refused and none read before, or without a store image.
fn render_managed(
    read: &BackendRead<'_>,
    managed: &kvcache_api::backend::Managed,
    settings: &Settings,
    image: Option<&str>,
    obs: &mut Observation,
    plan: &mut BackendPlan,
) -> Result<(), Error> {
    let b = read.backend;
    let name = b.metadata.name.clone().unwrap_or_default();
    match image {
        // Refused settings and none read before: what runs stays as it is.
        _ if read.settings.is_none() => {}
        None => {
            let e = Error::NoStoreImage {
                backend: name.clone(),
            };
            obs.render_refused = Some((e.reason(), e.to_string()));
        }
        Some(image) => {
            let (ceilings, _) = read.world.ceilings_on(&name);
            // A refused policy keeps the document already written (never a partial one).
            let doc = policy::render(&name, &ceilings).ok();
            let bound = obs.bound_namespaces.clone();
            let mut objects = render(&BackendInputs {
                backend: b,
                store_image: image,
                namespace: read.namespace,
                elector_image: settings.elector_image(),
                etcd_image: settings.etcd_image(),
                bound_namespaces: &bound,
                policy: doc.as_ref(),
                access: read.access,
            })?;
            let live = |n: Option<&String>| {
                read.deployments
                    .iter()
                    .find(|d| d.metadata.name.as_ref() == n)
            };
            if let Some(d) = objects.deployment.as_mut() {
                let held = hold_standbys(live(d.metadata.name.as_ref()), d);
                if held && let Some(spec) = d.spec.as_mut() {
                    spec.replicas = Some(1);
                }
                obs.standbys_held = held;
                obs.leader = live(d.metadata.name.as_ref()).map(read::replicas);
            }
            obs.etcd = objects.etcd.as_ref().and_then(|rendered| {
                read.stateful_sets
                    .iter()
                    .find(|s| s.metadata.name == rendered.metadata.name)
                    .map(|s| read::etcd(s, &name, read.namespace, &managed.leader))
            });
            obs.rendered_hashes = objects.daemon_sets.iter().map(pod_spec_hash).collect();
            narrow_groups(read, &objects.daemon_sets, obs, plan);
            obs.unguarded_groups = Some(access::uncovered_groups(&objects.daemon_sets));
            plan.groups = managed
                .members
                .iter()
                .zip(&objects.daemon_sets)
                .map(|(g, rendered)| GroupFacts {
                    tier: g.tier().is_some(),
                    desired: read
                        .daemon_sets
                        .iter()
                        .find(|d| d.metadata.name == rendered.metadata.name)
                        .and_then(|d| d.status.as_ref())
                        .map(|s| s.desired_number_scheduled),
                })
                .collect();
            // The workloads' budgets as they stand: a held leader's, each group's on its nodes.
            let scheduled: Vec<_> = plan.groups.iter().map(|g| g.desired).collect();
            objects.pdbs = objects.budgets(&scheduled);
            plan.write_policy = doc.is_some() || !managed.leader.multi_tenancy;
            probe_enforcement(read, obs, plan, &objects, Some(image));
            plan.objects = Some(objects);
        }
    }
    Ok(())
}

/// Member groups whose rendered placement (node selector, required affinity, tolerations)
/// changed and no longer admits nodes their members run on
/// (`crate::members::maintenance::narrowed_nodes`): those members are marked leaving and drained
/// first, and the group's DaemonSet is held at its live template meanwhile (the DaemonSet
/// controller would delete them at once), its live fingerprint standing for the rendered one
/// so that nothing else of the group rolls. [`release_narrowed`] lets it go.
fn narrow_groups(
    read: &BackendRead<'_>,
    rendered: &[DaemonSet],
    obs: &mut Observation,
    plan: &mut BackendPlan,
) {
    let nodes: BTreeMap<String, &Node> = read
        .nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, n.as_ref())))
        .collect();
    for (group, ds) in rendered.iter().enumerate() {
        let Some(live) = read
            .daemon_sets
            .iter()
            .find(|d| d.metadata.name == ds.metadata.name)
        else {
            continue;
        };
        let live_hash = pod_spec_hash(live);
        let template = |d: &DaemonSet| d.spec.as_ref().and_then(|s| s.template.spec.clone());
        let Some(spec) = template(ds) else {
            continue;
        };
        let live_spec = template(live).unwrap_or_default();
        if maintenance::same_placement(&spec, &live_spec) {
            continue;
        }
        let on = obs
            .members
            .iter()
            .filter(|m| m.group == group && !m.terminating)
            .map(|m| m.node.as_str());
        let lost = maintenance::narrowed_nodes(&spec, on, &nodes);
        if lost.is_empty() {
            continue;
        }
        for m in obs.members.iter_mut().filter(|m| m.group == group) {
            if m.leaving.is_none() && lost.contains(&m.node) {
                m.leaving = Some(Leaving::GroupNarrowed);
            }
        }
        if let Some(h) = obs.rendered_hashes.get_mut(group) {
            *h = live_hash;
        }
        plan.held_groups
            .push(ds.metadata.name.clone().unwrap_or_default());
    }
}

/// Lets a narrowed group's DaemonSet go ([`narrow_groups`]) once each of the group's leaving
/// members is held, drained or why not (`Drained` says which, and what is lost); while one still
/// drains, or none may start (a warm backend's leader unsettled), the live template stays.
fn release_narrowed(obs: &mut Observation, plan: &mut BackendPlan) {
    let names: Vec<String> = plan.held_groups.drain(..).collect();
    for name in names {
        let Some((group, rendered)) = plan.objects.as_ref().and_then(|o| {
            o.daemon_sets
                .iter()
                .enumerate()
                .find(|(_, d)| d.metadata.name.as_ref() == Some(&name))
                .map(|(g, d)| (g, pod_spec_hash(d)))
        }) else {
            continue;
        };
        let held = obs
            .rollout
            .iter()
            .filter(|s| s.group == group)
            .flat_map(|s| &s.held)
            .map(|h| h.pod.as_str())
            .collect::<Vec<_>>();
        let settled = obs
            .members
            .iter()
            .filter(|m| m.group == group && !m.terminating && m.leaving.is_some())
            .all(|m| held.contains(&m.name.as_str()));
        if !settled {
            plan.held_groups.push(name);
        } else if let Some(h) = obs.rendered_hashes.get_mut(group) {
            // Applied this pass: the status reads the fingerprint written.
            *h = rendered;
        }
    }
}

/// Decides one pass for the backend from what was read.
pub fn plan(read: &BackendRead<'_>) -> Result<BackendPlan, Error> {
    let b = read.backend;
    let name = b.metadata.name.clone().unwrap_or_default();
    let (mut members, other_members) = members(&name, read.store_pods);
    let leaving = maintenance::leaving_nodes(read.nodes.iter().map(AsRef::as_ref));
    maintenance::mark(&mut members, &leaving);
    let mut obs = Observation {
        used_by: read.world.consumers(&name),
        bound_namespaces: read.world.bound_namespaces(&name),
        members,
        other_members,
        store: read.store.clone(),
        ..Observation::empty(b.metadata.generation)
    };
    let mut plan = BackendPlan {
        objects: None,
        write_policy: false,
        groups: Vec::new(),
        observation: Observation::empty(None),
        foreign: Vec::new(),
        quarantine: Vec::new(),
        recheck: None,
        probe_create: None,
        probe_delete: Vec::new(),
        held_groups: Vec::new(),
        handover: None,
    };
    if let Some(x) = &b.spec.connection.external {
        obs.endpoint = x.address(EndpointName::Client).map(str::to_owned);
    }
    if let Some(managed) = &b.spec.connection.managed {
        obs.endpoint = Some(client_endpoint(&name, read.namespace));
        obs.settings_refused = read
            .settings_refused
            .clone()
            .map(|why| (why, read.settings.is_some()));
        let default = Settings::default();
        let settings = read.settings.unwrap_or(&default);
        let image = store_image(b, settings);
        render_managed(read, managed, settings, image, &mut obs, &mut plan)?;
        if managed.leader.elects() {
            // What the running master says it is, published by the elector.
            let tagged = image.and_then(store_version_of_image);
            obs.store_version = read
                .lease
                .and_then(|l| l.metadata.annotations.as_ref())
                .and_then(|a| a.get(kvcache_api::STORE_VERSION_ANNOTATION))
                .cloned()
                .map(|running| (running, tagged));
            obs.lease_holder = read.lease.map(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.clone())
                    .filter(|h| !h.is_empty())
            });
        }
        plan.handover = maintenance::leader_handover(
            &label_value(&name),
            managed.leader.warm(),
            read.store_pods,
            &leaving,
        );
        if plan.objects.is_some() {
            obs.rollout = rollout(read, &obs, &plan.groups, &BTreeMap::new());
            release_narrowed(&mut obs, &mut plan);
        }
    }
    if let Some(Ok(segments)) = obs.store.as_ref().map(|s| &s.segments) {
        plan.foreign = foreign_mounts(segments, &obs.members, &obs.other_members)
            .into_iter()
            .cloned()
            .collect();
    }
    if plan.objects.is_none() {
        // Nothing rendered: no policies to check, and no probe Pod kept.
        probe_enforcement(read, &mut obs, &mut plan, &BackendObjects::default(), None);
    }
    judge_segments(read, &mut obs, &mut plan);
    plan.observation = obs;
    Ok(plan)
}
