//! The cluster settings admission and rendering read.

/// The cluster settings the KV-cache rules depend on. As a file (`--settings`), YAML with the
/// setting names as keys: `kv-cache-backend-image`, `kv-cache-elector-image`,
/// `kv-cache-etcd-image`, `model-deployment-kv-cache-dtype-owned`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `kv-cache-backend-image`: the store image for backends that name none. Empty: a backend
    /// must name its own image.
    #[serde(rename = "kv-cache-backend-image")]
    pub kv_cache_backend_image: Option<String>,
    /// `kv-cache-elector-image`: the image that delivers `kvcache-elector` into the store Pods
    /// that elect a leader or find it through the Lease. It is versioned with the elector, not
    /// with the operator, so that upgrading the operator changes no store Pod's template.
    #[serde(rename = "kv-cache-elector-image")]
    pub kv_cache_elector_image: Option<String>,
    /// `kv-cache-etcd-image`: the etcd a backend with `leader.electionBackend: Etcd` runs.
    #[serde(rename = "kv-cache-etcd-image")]
    pub kv_cache_etcd_image: Option<String>,
    /// `model-deployment-kv-cache-dtype-owned`: the Binding's dtype is rendered as
    /// `--kv-cache-dtype`, and users may not set their own.
    #[serde(rename = "model-deployment-kv-cache-dtype-owned")]
    pub kv_cache_dtype_owned: bool,
}

/// The default of `kv-cache-backend-image`: the project's CPU build of the store.
pub const DEFAULT_BACKEND_IMAGE: &str = "gpustack/mirrored-mooncake:0.3.13.post1-cpu";

/// The default of `kv-cache-elector-image`. Its tag is `kvcache-elector`'s own crate version
/// (crates/kvcache-elector/Cargo.toml; a test there keeps the two equal): it moves when the
/// elector does, never with an operator release alone.
pub const DEFAULT_ELECTOR_IMAGE: &str = "gpustack/kvcache-elector:0.2.0";

/// The default of `kv-cache-etcd-image`: etcd built from the module the Kubernetes release
/// pins (v3.6.4), on an empty base (`images/etcd/Dockerfile`).
pub const DEFAULT_ETCD_IMAGE: &str = "gpustack/kvcache-etcd:v3.6.4";

/// The settings' keys, as the ConfigMap and the settings file spell them.
pub mod keys {
    /// The store image for backends that name none.
    pub const BACKEND_IMAGE: &str = "kv-cache-backend-image";
    /// The image that delivers the elector.
    pub const ELECTOR_IMAGE: &str = "kv-cache-elector-image";
    /// The etcd image of warm-failover backends.
    pub const ETCD_IMAGE: &str = "kv-cache-etcd-image";
    /// Whether the operator owns `--kv-cache-dtype`.
    pub const DTYPE_OWNED: &str = "model-deployment-kv-cache-dtype-owned";
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            kv_cache_backend_image: Some(DEFAULT_BACKEND_IMAGE.to_owned()),
            kv_cache_elector_image: Some(DEFAULT_ELECTOR_IMAGE.to_owned()),
            kv_cache_etcd_image: Some(DEFAULT_ETCD_IMAGE.to_owned()),
            kv_cache_dtype_owned: true,
        }
    }
}

impl Settings {
    /// The backend image setting, if it holds a non-blank value.
    pub fn backend_image(&self) -> Option<&str> {
        self.kv_cache_backend_image
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// The elector image: the setting, or [`DEFAULT_ELECTOR_IMAGE`] when it is absent.
    pub fn elector_image(&self) -> &str {
        self.kv_cache_elector_image
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_ELECTOR_IMAGE)
    }

    /// The etcd image: the setting, or [`DEFAULT_ETCD_IMAGE`] when it is absent.
    pub fn etcd_image(&self) -> &str {
        self.kv_cache_etcd_image
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_ETCD_IMAGE)
    }

    /// Refuses values that cannot be used: a blank elector or etcd image (store Pods that
    /// elect, or a warm backend's etcd, could not start) names its key.
    fn checked(self, source: &str) -> Result<Self, crate::error::Error> {
        for (key, value, problem) in [
            (
                keys::ELECTOR_IMAGE,
                &self.kv_cache_elector_image,
                "is blank: name the elector image or remove the key for the default",
            ),
            (
                keys::ETCD_IMAGE,
                &self.kv_cache_etcd_image,
                "is blank: name the etcd image or remove the key for the default",
            ),
        ] {
            if let Some(image) = value
                && image.trim().is_empty()
            {
                return Err(crate::error::Error::SettingValue {
                    source_name: source.to_owned(),
                    key,
                    value: image.clone(),
                    problem,
                });
            }
        }
        Ok(self)
    }
}

/// What the operator renders with after a read of the settings ConfigMap.
#[derive(Debug)]
pub struct Chosen {
    /// The settings to use; `None` when a read was refused and there are no earlier ones to
    /// keep: then nothing that depends on them is rendered.
    pub settings: Option<Settings>,
    /// Why the newest read was refused, naming the key; `None` when it was read.
    pub refused: Option<crate::error::Error>,
}

/// Which settings to use after a read: `read` is `None` when the ConfigMap is absent (the
/// defaults apply: deleting it is a choice), `Some(Err(_))` when a value is unusable. A refused
/// read never reverts to the defaults: the last good settings are kept, or none are used.
pub fn choose(
    read: Option<Result<Settings, crate::error::Error>>,
    last_good: Option<&Settings>,
) -> Chosen {
    match read {
        None => Chosen {
            settings: Some(Settings::default()),
            refused: None,
        },
        Some(Ok(s)) => Chosen {
            settings: Some(s),
            refused: None,
        },
        Some(Err(e)) => Chosen {
            settings: last_good.cloned(),
            refused: Some(e),
        },
    }
}

/// Where the cluster settings live: a ConfigMap of this name in the operator's namespace.
pub const SETTINGS_CONFIG_MAP: &str = "gpustack-settings";

impl Settings {
    /// Reads the settings ConfigMap's data ([`keys`]); absent keys keep their defaults, other
    /// keys are not ours and are ignored. A flag that is neither `true` nor `false`, or a blank
    /// elector image, is an error naming the key.
    pub fn from_data(
        source: &str,
        data: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, crate::error::Error> {
        let mut s = Settings::default();
        if let Some(image) = data.get(keys::BACKEND_IMAGE) {
            s.kv_cache_backend_image = Some(image.clone());
        }
        if let Some(image) = data.get(keys::ELECTOR_IMAGE) {
            s.kv_cache_elector_image = Some(image.clone());
        }
        if let Some(image) = data.get(keys::ETCD_IMAGE) {
            s.kv_cache_etcd_image = Some(image.clone());
        }
        if let Some(flag) = data.get(keys::DTYPE_OWNED) {
            s.kv_cache_dtype_owned = match flag.trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(crate::error::Error::SettingValue {
                        source_name: source.to_owned(),
                        key: keys::DTYPE_OWNED,
                        value: other.to_owned(),
                        problem: "is neither true nor false",
                    });
                }
            };
        }
        s.checked(source)
    }

    /// Reads a settings file; absent keys keep their defaults.
    pub fn from_yaml(source: &str, text: &str) -> Result<Self, crate::error::Error> {
        serde_yaml::from_str::<Settings>(text)
            .map_err(|e| crate::error::Error::ManifestSyntax {
                source_name: source.to_owned(),
                index: 1,
                message: e.to_string(),
            })?
            .checked(source)
    }
}
