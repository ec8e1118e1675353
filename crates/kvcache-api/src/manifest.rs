//! Reading manifests: multi-document YAML (or JSON) into typed objects, with unknown fields
//! reported the way a strict client reports them.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::GROUP;
use crate::InstanceType;
use crate::KVCachePool;
use crate::KVCachePoolBinding;
use crate::VERSION;
use crate::admission::{Admission, Verdict};
use crate::backend::KVCacheBackend;
use crate::error::Error;
use crate::model::ModelDeployment;
use crate::settings::Settings;

/// One object of this operator's kinds.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A `KVCacheBackend`: a store. Cluster-scoped.
    Backend(Box<KVCacheBackend>),
    /// A `KVCachePool`: one backend and a quota total. Cluster-scoped.
    Pool(Box<KVCachePool>),
    /// A `KVCachePoolBinding`: a namespace's grant on a pool. Namespaced.
    Binding(Box<KVCachePoolBinding>),
    /// A `ModelDeployment`: a model, its engine and roles. Namespaced.
    ModelDeployment(Box<ModelDeployment>),
    /// An `InstanceType`: placement and per-accelerator resources for roles. Cluster-scoped.
    InstanceType(Box<InstanceType>),
}

/// A parsed object with where it came from and the fields no schema knows.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The file (or other source) name.
    pub source: String,
    /// 1-based document index in the source.
    pub index: usize,
    /// The typed object; fields its kind does not have are dropped and listed in
    /// `unknown_fields`.
    pub object: Object,
    /// Paths of fields the kind does not have (`spec.metadata`): strict clients refuse them, the
    /// API server prunes them.
    pub unknown_fields: Vec<String>,
}

/// Which object: kind, namespace (absent for cluster-scoped kinds) and name. How reviews and
/// findings name the object they judge.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// The kind (`KVCachePoolBinding`).
    pub kind: &'static str,
    /// The namespace of a namespaced kind.
    pub namespace: Option<String>,
    /// `metadata.name`; `<unnamed>` when the object has none.
    pub name: String,
}

impl ObjectRef {
    /// The object of `kind` with this metadata.
    pub fn new(
        kind: &'static str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Self {
        ObjectRef {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_else(|| "<unnamed>".into()),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

impl Object {
    /// Its kind, namespace and name: how refusals and messages name it.
    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef::new(self.kind(), self.metadata())
    }

    /// The object's `metadata` (name, namespace, labels, …), whatever its kind.
    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Object::Backend(o) => &o.metadata,
            Object::Pool(o) => &o.metadata,
            Object::Binding(o) => &o.metadata,
            Object::ModelDeployment(o) => &o.metadata,
            Object::InstanceType(o) => &o.metadata,
        }
    }

    /// The kind as a manifest's `kind:` spells it, e.g. `KVCachePoolBinding`.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Backend(_) => "KVCacheBackend",
            Object::Pool(_) => "KVCachePool",
            Object::Binding(_) => "KVCachePoolBinding",
            Object::ModelDeployment(_) => "ModelDeployment",
            Object::InstanceType(_) => "InstanceType",
        }
    }

    /// `kind namespace/name` or `kind name`.
    pub fn describe(&self) -> String {
        self.object_ref().to_string()
    }

    /// Create-time admission.
    pub fn validate_create(&self, settings: &Settings) -> Verdict {
        match self {
            Object::Backend(o) => o.validate_create(settings),
            Object::Pool(o) => o.validate_create(settings),
            Object::Binding(o) => o.validate_create(settings),
            Object::ModelDeployment(o) => o.validate_create(settings),
            Object::InstanceType(o) => o.validate_create(settings),
        }
    }

    /// Update-time admission against `old`; `None` when the kinds differ.
    pub fn validate_update(&self, old: &Object, settings: &Settings) -> Option<Verdict> {
        Some(match (self, old) {
            (Object::Backend(n), Object::Backend(o)) => n.validate_update(o, settings),
            (Object::Pool(n), Object::Pool(o)) => n.validate_update(o, settings),
            (Object::Binding(n), Object::Binding(o)) => n.validate_update(o, settings),
            (Object::ModelDeployment(n), Object::ModelDeployment(o)) => {
                n.validate_update(o, settings)
            }
            (Object::InstanceType(n), Object::InstanceType(o)) => n.validate_update(o, settings),
            _ => return None,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

fn typed<T: DeserializeOwned>(
    value: serde_json::Value,
    source: &str,
    kind: &str,
) -> Result<(T, Vec<String>), Error> {
    let name = value
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>")
        .to_owned();
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| {
        let path = path.to_string();
        // The type meta is read by the kind dispatch, not by the object itself.
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    };
    let ignored = serde_ignored::Deserializer::new(value, &mut record);
    let object = serde_path_to_error::deserialize(ignored).map_err(|e| Error::ManifestShape {
        source_name: source.to_owned(),
        kind: kind.to_owned(),
        name,
        message: format!("{}: {}", e.path(), e.inner()),
    })?;
    Ok((object, unknown))
}

/// Parses every document of a YAML (or JSON) text. Empty documents are skipped, and so is a
/// core `v1` Namespace (the examples ship the namespaces they use; there is nothing to judge in
/// one).
pub fn parse(source: &str, text: &str) -> Result<Vec<Manifest>, Error> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value = serde_json::Value::deserialize(doc).map_err(|e| Error::ManifestSyntax {
            source_name: source.to_owned(),
            index,
            message: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        let meta: TypeMeta =
            serde_json::from_value(value.clone()).map_err(|e| Error::ManifestSyntax {
                source_name: source.to_owned(),
                index,
                message: e.to_string(),
            })?;
        if meta.api_version == "v1" && meta.kind == "Namespace" {
            continue;
        }
        let ours = meta.api_version == format!("{GROUP}/{VERSION}");
        let (object, unknown_fields) =
            match (ours, meta.kind.as_str()) {
                (true, "KVCacheBackend") => typed(value, source, &meta.kind)
                    .map(|(o, u)| (Object::Backend(Box::new(o)), u))?,
                (true, "KVCachePool") => {
                    typed(value, source, &meta.kind).map(|(o, u)| (Object::Pool(Box::new(o)), u))?
                }
                (true, "KVCachePoolBinding") => typed(value, source, &meta.kind)
                    .map(|(o, u)| (Object::Binding(Box::new(o)), u))?,
                (true, "ModelDeployment") => typed(value, source, &meta.kind)
                    .map(|(o, u)| (Object::ModelDeployment(Box::new(o)), u))?,
                (true, "InstanceType") => typed(value, source, &meta.kind)
                    .map(|(o, u)| (Object::InstanceType(Box::new(o)), u))?,
                _ => {
                    return Err(Error::UnknownKind {
                        source_name: source.to_owned(),
                        index,
                        api_version: meta.api_version,
                        kind: meta.kind,
                    });
                }
            };
        out.push(Manifest {
            source: source.to_owned(),
            index,
            object,
            unknown_fields,
        });
    }
    Ok(out)
}
