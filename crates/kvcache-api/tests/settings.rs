//! The cluster settings as the ConfigMap and the settings file give them.

use std::collections::BTreeMap;

use kvcache_api::Error;
use kvcache_api::settings::{DEFAULT_ELECTOR_IMAGE, Settings, choose, keys};

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn absent_keys_keep_their_defaults_and_foreign_keys_are_ignored() {
    let s = Settings::from_data("gpustack-settings", &data(&[("gpustack-other", "x")]))
        .expect("readable");
    assert_eq!(s, Settings::default());
    assert_eq!(s.elector_image(), DEFAULT_ELECTOR_IMAGE);
}

#[test]
fn the_elector_image_is_read_from_its_key() {
    let s = Settings::from_data(
        "gpustack-settings",
        &data(&[(
            keys::ELECTOR_IMAGE,
            " registry.local/kvcache-elector:0.2.0 ",
        )]),
    )
    .expect("readable");
    assert_eq!(s.elector_image(), "registry.local/kvcache-elector:0.2.0");
}

#[test]
fn an_unusable_value_is_an_error_naming_its_key() {
    for (key, value) in [(keys::DTYPE_OWNED, "yes"), (keys::ELECTOR_IMAGE, "  ")] {
        match Settings::from_data("gpustack-settings", &data(&[(key, value)])) {
            Err(Error::SettingValue { key: named, .. }) => assert_eq!(named, key),
            other => panic!("{key}={value:?}: expected a SettingValue error, got {other:?}"),
        }
    }
    match Settings::from_yaml("settings.yaml", "kv-cache-elector-image: ''\n") {
        Err(Error::SettingValue { key, .. }) => assert_eq!(key, keys::ELECTOR_IMAGE),
        other => panic!("expected a SettingValue error, got {other:?}"),
    }
}

#[test]
fn a_blank_backend_image_is_a_setting_not_an_error() {
    let s = Settings::from_data("gpustack-settings", &data(&[(keys::BACKEND_IMAGE, "")]))
        .expect("readable");
    assert_eq!(s.backend_image(), None);
}

#[test]
fn a_refused_read_keeps_the_last_good_settings_and_never_the_defaults() {
    let good = Settings {
        kv_cache_backend_image: Some("registry.local/store:1".into()),
        ..Settings::default()
    };
    let refused = || Settings::from_data("gpustack-settings", &data(&[(keys::DTYPE_OWNED, "yes")]));
    let kept = choose(Some(refused()), Some(&good));
    assert_eq!(kept.settings.as_ref(), Some(&good));
    assert!(matches!(
        kept.refused,
        Some(Error::SettingValue {
            key: keys::DTYPE_OWNED,
            ..
        })
    ));
    let none = choose(Some(refused()), None);
    assert_eq!(
        none.settings, None,
        "no earlier settings: none, not the defaults"
    );
    assert!(none.refused.is_some());
    let absent = choose(None, Some(&good));
    assert_eq!(
        absent.settings,
        Some(Settings::default()),
        "an absent ConfigMap is the defaults"
    );
    assert!(absent.refused.is_none());
    let read = choose(Some(Ok(good.clone())), None);
    assert_eq!((read.settings, read.refused.is_none()), (Some(good), true));
}
