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

impl Settings {
    /// Reads a settings file; absent keys keep their defaults.
    pub fn from_yaml(source: &str, text: &str) -> Result<Self, crate::Error> {
        serde_yaml::from_str(text).map_err(|e| crate::Error::ManifestSyntax {
            source_name: source.to_owned(),
            index: 1,
            message: e.to_string(),
        })
    }
}
