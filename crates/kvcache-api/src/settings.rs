//! The cluster settings admission and rendering read.

/// The cluster settings the KV-cache rules depend on. As a file (`--settings`), YAML with the
/// setting names as keys: `kv-cache-backend-image`, `model-deployment-kv-cache-dtype-owned`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `kv-cache-backend-image`: the store image for backends that name none. Empty: a backend
    /// must name its own image.
    #[serde(rename = "kv-cache-backend-image")]
    pub kv_cache_backend_image: Option<String>,
    /// `model-deployment-kv-cache-dtype-owned`: the Binding's dtype is rendered as
    /// `--kv-cache-dtype`, and users may not set their own.
    #[serde(rename = "model-deployment-kv-cache-dtype-owned")]
    pub kv_cache_dtype_owned: bool,
}

/// The default of `kv-cache-backend-image`: the project's CPU build of the store.
pub const DEFAULT_BACKEND_IMAGE: &str = "gpustack/mirrored-mooncake:0.3.13.post1-cpu";

impl Default for Settings {
    fn default() -> Self {
        Settings {
            kv_cache_backend_image: Some(DEFAULT_BACKEND_IMAGE.to_owned()),
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
}

/// Where the cluster settings live: a ConfigMap of this name in the operator's namespace.
pub const SETTINGS_CONFIG_MAP: &str = "gpustack-settings";

impl Settings {
    /// Reads the settings ConfigMap's data (`kv-cache-backend-image`,
    /// `model-deployment-kv-cache-dtype-owned`); absent keys keep their defaults, other keys
    /// are not ours and are ignored. A flag that is neither `true` nor `false` is an error
    /// naming the key.
    pub fn from_data(
        source: &str,
        data: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, crate::Error> {
        let mut s = Settings::default();
        if let Some(image) = data.get("kv-cache-backend-image") {
            s.kv_cache_backend_image = Some(image.clone());
        }
        if let Some(flag) = data.get("model-deployment-kv-cache-dtype-owned") {
            s.kv_cache_dtype_owned = match flag.trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(crate::Error::ManifestSyntax {
                        source_name: source.to_owned(),
                        index: 1,
                        message: format!(
                            "model-deployment-kv-cache-dtype-owned: {other:?} is neither true nor false"
                        ),
                    });
                }
            };
        }
        Ok(s)
    }

    /// Reads a settings file; absent keys keep their defaults.
    pub fn from_yaml(source: &str, text: &str) -> Result<Self, crate::Error> {
        serde_yaml::from_str(text).map_err(|e| crate::Error::ManifestSyntax {
            source_name: source.to_owned(),
            index: 1,
            message: e.to_string(),
        })
    }
}
