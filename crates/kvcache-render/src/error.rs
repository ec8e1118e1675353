//! What rendering can fail with: one error for the crate, each cause with a condition reason.

/// What rendering can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A quantity in the spec does not parse (admission refuses these; a stored object from
    /// before the rule can still carry one).
    #[error(transparent)]
    Api(#[from] kvcache_api::Error),
    /// A ModelDeployment role that cannot be attached to its cache.
    #[error("ModelDeployment {deployment} role {role}: {source}")]
    Injection {
        /// `namespace/name`.
        deployment: String,
        /// The role's `name` in `spec.roles`.
        role: String,
        /// Why the injection refused the role; its reason becomes the error's reason.
        source: kvcache_inject::Error,
    },
    /// A reference to an object that does not exist.
    #[error("{referrer}: {field} names {kind} {name}, which does not exist{hint}")]
    Missing {
        /// The object holding the reference.
        referrer: Box<kvcache_api::manifest::ObjectRef>,
        /// The field of `referrer` that names the object, e.g. `spec.poolRef.name`.
        field: &'static str,
        /// The kind the field names, e.g. `KVCachePool`.
        kind: &'static str,
        /// The name (`namespace/name` for a namespaced kind).
        name: String,
        /// What to do, starting with `; ` (or empty).
        hint: &'static str,
    },
    /// A ModelDeployment naming a Binding being deleted: its roles are held as they are.
    #[error(
        "ModelDeployment {deployment}: KVCachePoolBinding {binding} is being deleted, so the operator leaves the roles as they are; point spec.kvCache.poolRef.name at another Binding of this namespace, or remove spec.kvCache"
    )]
    BindingDeleted {
        /// `namespace/name` of the ModelDeployment.
        deployment: String,
        /// `namespace/name` of the Binding.
        binding: String,
    },
    /// A managed backend with no store image anywhere.
    #[error(
        "KVCacheBackend {backend}: no store image (spec.image is unset and the kv-cache-backend-image setting is empty); set one of them"
    )]
    NoStoreImage {
        /// Name of the managed KVCacheBackend left without an image.
        backend: String,
    },
    /// A backend that sets neither connection.
    #[error("KVCacheBackend {backend}: spec.connection sets neither managed nor external")]
    NoConnection {
        /// Name of the KVCacheBackend whose `spec.connection` sets neither.
        backend: String,
    },
    /// An InstanceType CPU figure that is not a CPU quantity.
    #[error(
        "InstanceType {instance_type} spec.resources.cpu {value:?} is not a CPU quantity: {source}; write cores (2, 0.5) or millicores (500m)"
    )]
    Cpu {
        /// Name of the InstanceType whose `spec.resources.cpu` does not parse.
        instance_type: String,
        /// The value as written.
        value: String,
        /// What is wrong with it (no number, an unknown suffix, a fraction, …).
        source: kvcache_api::quantity::QuantityError,
    },
    /// The backend's tenant policy document was refused.
    #[error(transparent)]
    Policy(#[from] kvcache_quota::Error),
    /// A rendered object that could not be written as YAML.
    #[error("{object}: cannot be written as YAML: {message}")]
    Yaml {
        /// `kind name` of the object.
        object: String,
        /// The YAML serialiser's message.
        message: String,
    },
}

impl Error {
    /// A CamelCase reason a condition can carry.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Api(_) => "InvalidQuantity",
            Error::Injection { source, .. } => source.reason(),
            Error::Missing { .. } => "ReferenceNotFound",
            Error::BindingDeleted { .. } => "BindingDeleted",
            Error::NoStoreImage { .. } => "NoStoreImage",
            Error::NoConnection { .. } => "NoConnection",
            Error::Cpu { .. } => "InvalidCPU",
            Error::Policy(_) => "PolicyRefused",
            Error::Yaml { .. } => "SerializationFailed",
        }
    }
}
