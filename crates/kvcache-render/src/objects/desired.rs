//! What one owner's pass wants in the cluster, as one ordered list: each object in the order it
//! is applied, how it is applied, and the kinds the owner's sweep lists. The controllers apply
//! the list as it is (`crates/kvcache-operator/src/controllers/applied.rs`) and the offline
//! `kvcache-operator render` prints it ([`crate::plan::resolve::render_all`]), so the two cannot drift.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::Error;

/// A kind an owner's objects come in: what a client needs to apply, list and delete them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectKind {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// `apiVersion` as objects write it.
    pub api_version: &'static str,
    /// `kind`.
    pub kind: &'static str,
    /// The plural resource name of the URL path.
    pub plural: &'static str,
    /// A workload (Deployment, DaemonSet, StatefulSet): a teardown deletes it in the foreground
    /// and waits for its Pods.
    pub workload: bool,
}

impl ObjectKind {
    /// The kind of `K`, its objects going at once.
    pub const fn of<K: k8s_openapi::Resource>() -> Self {
        ObjectKind {
            group: K::GROUP,
            version: K::VERSION,
            api_version: K::API_VERSION,
            kind: K::KIND,
            plural: K::URL_PATH_SEGMENT,
            workload: false,
        }
    }

    /// The kind of the workload `K`: a teardown waits for its Pods.
    pub const fn workload<K: k8s_openapi::Resource>() -> Self {
        ObjectKind {
            workload: true,
            ..Self::of::<K>()
        }
    }
}

/// How a listed object is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Applied server-side under the operator's field manager, forced.
    Apply,
    /// Created when no object of its name exists, else left as it is: fields other writers own
    /// after creation (a Lease's holder) are never applied over.
    CreateOnce,
    /// Left as it is this pass, and spared by the sweep: a member group's DaemonSet whose edit
    /// waits for the members it would delete to drain (`crate::plan::backend`).
    Keep,
}

/// A typed object behind a [`Desired`], serialisable both ways.
trait Rendered: fmt::Debug + Send + Sync {
    fn json(&self) -> Result<serde_json::Value, serde_json::Error>;
    fn yaml(&self) -> Result<serde_yaml::Value, serde_yaml::Error>;
}

impl<T: serde::Serialize + fmt::Debug + Send + Sync> Rendered for T {
    fn json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }
    fn yaml(&self) -> Result<serde_yaml::Value, serde_yaml::Error> {
        serde_yaml::to_value(self)
    }
}

/// One object of an owner's pass.
#[derive(Clone, Debug)]
pub struct Desired {
    /// Its kind.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// How it is written.
    pub write: Write,
    object: Arc<dyn Rendered>,
}

impl Desired {
    /// The object as the API server takes it.
    pub fn json(&self) -> Result<serde_json::Value, Error> {
        self.object.json().map_err(|e| Error::Yaml {
            object: self.to_string(),
            message: e.to_string(),
        })
    }

    /// The object as `kvcache-operator render` prints it (fields in the typed order).
    pub fn yaml(&self) -> Result<serde_yaml::Value, Error> {
        self.object.yaml().map_err(|e| Error::Yaml {
            object: self.to_string(),
            message: e.to_string(),
        })
    }
}

impl fmt::Display for Desired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.kind, self.name)
    }
}

/// One owner's pass: its objects in apply order, the kinds its sweep lists, and the kinds it
/// leaves as they are this pass (neither written nor swept).
#[derive(Clone, Debug)]
pub struct DesiredSet {
    /// The objects, in the order they are written.
    pub objects: Vec<Desired>,
    /// Every kind the owner's objects may come in, listed by the sweep: what a pass no longer
    /// renders goes.
    pub kinds: &'static [ObjectKind],
    /// Kinds left as they are this pass.
    pub left: Vec<ObjectKind>,
}

impl DesiredSet {
    /// An empty pass over `kinds` (a teardown sweeps everything of them).
    pub fn new(kinds: &'static [ObjectKind]) -> Self {
        DesiredSet {
            objects: Vec::new(),
            kinds,
            left: Vec::new(),
        }
    }

    /// Appends `object`, written as `write`.
    pub(crate) fn push<K>(&mut self, object: &K, write: Write)
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = ObjectMeta>
            + serde::Serialize
            + Clone
            + fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.objects.push(Desired {
            kind: self
                .kinds
                .iter()
                .find(|k| k.kind == K::KIND && k.api_version == K::API_VERSION)
                .copied()
                .unwrap_or(ObjectKind::of::<K>()),
            name: object.metadata().name.clone().unwrap_or_default(),
            write,
            object: Arc::new(object.clone()),
        });
    }

    /// Appends each of `objects`, applied.
    pub(crate) fn apply_all<'a, K>(&mut self, objects: impl IntoIterator<Item = &'a K>)
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = ObjectMeta>
            + serde::Serialize
            + Clone
            + fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        for o in objects {
            self.push(o, Write::Apply);
        }
    }

    /// Leaves the listed object of kind `K` named `name` as it is this pass ([`Write::Keep`]).
    pub(crate) fn keep<K: k8s_openapi::Resource>(&mut self, name: &str) {
        for o in &mut self.objects {
            if o.kind.kind == K::KIND && o.kind.api_version == K::API_VERSION && o.name == name {
                o.write = Write::Keep;
            }
        }
    }

    /// Leaves every object of kind `K` as it is this pass.
    pub(crate) fn leave<K: k8s_openapi::Resource>(&mut self) {
        self.left.push(ObjectKind::of::<K>());
    }

    /// Each object as `kvcache-operator render` prints it.
    pub fn yaml(&self) -> Result<Vec<serde_yaml::Value>, Error> {
        self.objects.iter().map(Desired::yaml).collect()
    }
}
