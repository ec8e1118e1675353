//! The alert rules themselves: what operators of a Mooncake store get paged for.

/// One alerting rule of the PrometheusRule the installation ships.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Alert {
    /// The rule's `alert:` name, CamelCase (`KVCacheBackendDegraded`).
    pub name: &'static str,
    /// The PromQL expression that fires it.
    pub expr: &'static str,
    /// How long it must hold.
    pub for_: &'static str,
    /// `warning` or `critical`.
    pub severity: &'static str,
    /// The `summary` annotation: one line, for alert lists.
    pub summary: &'static str,
    /// What it means and what to look at.
    pub description: &'static str,
}

/// What operators of a Mooncake store get paged for: the backends' and their stores' alerts,
/// then the tenants' and the operator's own.
pub(crate) fn alerts() -> Vec<Alert> {
    let mut all = backend_alerts();
    all.extend(tenant_and_operator_alerts());
    all
}

/// A backend's store stalled, unread, empty, degraded, mounted by a stranger, or refusing puts.
fn backend_alerts() -> Vec<Alert> {
    vec![
        Alert {
            name: "KVCacheStoreLeaderStalled",
            // Members ping their master every second: a master the operator reads (it serves
            // its metrics) that counts no ping and no put for five minutes has stopped serving
            // them. `max by (backend)`: the leading replica alone re-exports, and through a
            // handover the old and the new leader's series are one backend's.
            expr: "max by (backend) (rate(kvcache_operator_store_master_ping_requests_total[5m]) + rate(kvcache_operator_store_master_put_start_requests_total[5m])) == 0",
            for_: "5m",
            severity: "critical",
            summary: "A Mooncake master answers the operator but its ping and put counters stopped moving",
            description: "The master of KVCacheBackend {{ $labels.backend }} answers the operator's reads but no member has pinged it and no engine has put for 5 minutes: members cannot remount and engines miss. Check the log of its leader (Deployment {{ $labels.backend }}-leader in the operator's namespace) and its members', and `kubectl describe kvcb {{ $labels.backend }}`.",
        },
        Alert {
            name: "KVCacheStoreMetricsAbsent",
            // Every backend whose master the leader reads (one with an admin address: not an
            // external backend without an Admin endpoint) has kvcache_operator_store_reads_total,
            // dropped when the backend is deleted or loses its admin address; one whose
            // master's series the operator does not hold has none of the store's.
            expr: "max by (backend) (kvcache_operator_store_reads_total) unless on (backend) max by (backend) (kvcache_operator_backend_store_series > 0)",
            for_: "10m",
            severity: "warning",
            summary: "The operator re-exports none of a backend's store series",
            description: "The operator reads the master of KVCacheBackend {{ $labels.backend }} but has held no reading of it for 10 minutes (kvcache_operator_backend_store_series is absent): its reads fail or the master prints no series, so KVCacheStoreLeaderStalled and KVCacheTenantRejectsRising cannot fire for it. `kubectl describe kvcb {{ $labels.backend }}` (CapacityObserved) and kvcache_operator_store_reads_total{result=\"error\"} say whether the reads fail; check the leader Service and the operator's log.",
        },
        Alert {
            name: "KVCacheCapacityZeroWithMembersReady",
            expr: "kvcache_operator_backend_capacity_bytes == 0 and on (backend) kvcache_operator_backend_members{state=\"ready\"} > 0",
            for_: "5m",
            severity: "critical",
            summary: "A backend's members are Ready but the store registers no capacity",
            description: "KVCacheBackend {{ $labels.backend }} has Ready member Pods and CAPACITY 0: the members did not mount on the leader (wrong master address, a leader restart they have not followed, a tenant policy refusing them). `kubectl describe kvcb {{ $labels.backend }}` names the missing members.",
        },
        Alert {
            name: "KVCacheBackendDegraded",
            expr: "kvcache_operator_backend_degraded == 1",
            for_: "10m",
            severity: "warning",
            summary: "A KVCacheBackend has been Degraded for 10 minutes",
            description: "KVCacheBackend {{ $labels.backend }} reports phase Degraded: `kubectl get kvcb {{ $labels.backend }} -o yaml` shows the condition that says why (members not mounted, standbys missing, the leader not ready).",
        },
        Alert {
            name: "KVCacheUnknownSegment",
            // Set by the leading replica on every pass that reads a serving master's listing;
            // a segment counts once listed past the master's client TTL
            // (kvcache_render::members::mounts::grace), so a replaced member's does not fire it.
            expr: "max by (backend) (kvcache_operator_backend_unknown_segments) > 0",
            for_: "1m",
            severity: "critical",
            summary: "A process that is no member of the store mounted a segment on its master",
            description: "The master of KVCacheBackend {{ $labels.backend }} lists a segment that no member Pod of the backend mounted: the store places any tenant's blocks in that process's memory and serves them to other tenants from there (it can read and alter them). `kubectl get kvcb {{ $labels.backend }} -o jsonpath='{.status.unknownSegments}'` names each segment, its address and the Pod at that address; condition UnknownSegments says whether the operator drained it. Stop the process (a store client set up with global_segment_size above 0), and if its namespace shares the backend with others, consider a backend of its own (spec.tenancy: Dedicated).",
        },
        Alert {
            name: "KVCacheTenantRejectsRising",
            expr: "max by (backend) (rate(kvcache_operator_store_master_put_start_failures_total[5m])) > 0",
            for_: "10m",
            severity: "warning",
            summary: "A Mooncake master keeps refusing puts",
            description: "The master of KVCacheBackend {{ $labels.backend }} refuses puts (a tenant at its grant, or no space): engines write less than they try. Compare each Binding's grant and usage (kvcache_operator_binding_granted_bytes, kvcache_operator_binding_used_bytes) and kvcache_operator_store_mooncake_tenant_quota_admission_closed.",
        },
    ]
}

/// A tenant at its grant or its loads failing, and the operator failing, its certificate
/// expiring or no replica leading.
fn tenant_and_operator_alerts() -> Vec<Alert> {
    vec![
        Alert {
            name: "KVCacheTenantAtGrant",
            // The Binding's own QuotaPressure (kvcache_quota::status::quota_pressure), as a number.
            expr: "kvcache_operator_binding_quota_pressure == 1",
            for_: "15m",
            severity: "warning",
            summary: "A tenant has been at its grant for 15 minutes",
            description: "KVCachePoolBinding {{ $labels.namespace }}/{{ $labels.binding }} (domain {{ $labels.domain }}) has had QuotaPressure=True for 15 minutes: its domain holds more than 90% of its grant, so the store makes room for its new blocks by discarding its own older ones, or its engines' saves are refused at the grant, so new prompts are not cached; either way its hit ratio falls. `kubectl -n {{ $labels.namespace }} describe kvcpb {{ $labels.binding }}` names the reason and the fix: raise spec.quota.ceiling, the pool's total, or move workloads to another Binding.",
        },
        Alert {
            name: "KVCacheLoadsFallingBack",
            // The same share as SharedCacheHealthy (FALLBACK_SHARE in
            // crates/kvcache-render/src/observe/shared_cache/window.rs).
            expr: "kvcache_operator_model_shared_cache_failed_loads > 0.1 * kvcache_operator_model_shared_cache_loads and kvcache_operator_model_shared_cache_loads > 0",
            for_: "10m",
            severity: "warning",
            summary: "A deployment's loads from the shared cache keep failing",
            description: "More than 10% of the loads of ModelDeployment {{ $labels.namespace }}/{{ $labels.deployment }} from the store failed over its window: vLLM computes each such prompt again (kv_load_failure_policy: recompute), so the cache saves nothing for them. `kubectl -n {{ $labels.namespace }} describe md {{ $labels.deployment }}` names the Pods (SharedCacheHealthy); check the backend's members and the engines' logs.",
        },
        Alert {
            name: "KVCacheOperatorReconcileErrors",
            expr: "sum by (controller, result) (rate(kvcache_operator_reconciles_total{result!=\"ok\"}[10m])) > 0",
            for_: "15m",
            severity: "warning",
            summary: "The operator keeps failing to reconcile",
            description: "Controller {{ $labels.controller }} fails with {{ $labels.result }}: the objects' conditions and events say which and why (`kubectl get events -A --field-selector reportingComponent=kvcache-operator`).",
        },
        Alert {
            name: "KVCacheOperatorWebhookCertificateExpiring",
            // 0: the replica serves no webhook, or no pair is loaded yet.
            expr: "kvcache_operator_webhook_certificate_expiry_timestamp_seconds > 0 and (kvcache_operator_webhook_certificate_expiry_timestamp_seconds - time()) < 7 * 24 * 3600",
            for_: "60m",
            severity: "critical",
            summary: "The operator's webhook certificate expires within 7 days",
            description: "The operator replica {{ $labels.pod }} presents a webhook certificate that expires within 7 days: it renews 30 days ahead, so the renewal failed. When it expires the API server refuses every create and update of the operator's kinds and of opted-in Pods. Check the replicas' logs for \"webhook certificate\" and the Secret kvcache-operator-webhook-tls; deleting the Secret makes the leader issue a new pair.",
        },
        Alert {
            name: "KVCacheOperatorNoLeader",
            expr: "max(kvcache_operator_leader) == 0",
            for_: "5m",
            severity: "critical",
            summary: "No operator replica leads",
            description: "Every kvcache-operator replica stands by: nothing is reconciled. Check the Lease kvcache-operator in the operator's namespace and the replicas' logs.",
        },
    ]
}
