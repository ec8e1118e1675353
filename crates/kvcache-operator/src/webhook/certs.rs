//! The webhook's certificates: the operator makes its own CA and serving certificate (rcgen),
//! keeps them in two Secrets in its namespace (so that every replica serves the same pair and a
//! restart keeps it), writes the CA into its webhook configurations' `caBundle`, and renews the
//! serving certificate (and, near its end, the CA) before expiry.
//!
//! The CA's key lives in a Secret of its own (`--webhook-ca-secret`), apart from the serving
//! pair (`--webhook-secret`, which carries the CA certificate beside it, as a `kubernetes.io/tls`
//! Secret does): only the leading replica reads it, to sign, and whoever is given the serving
//! Secret (a monitoring probe, a mesh) is not given the power to mint certificates the API
//! server trusts. A serving Secret from before the split still holding `ca.key` is split on the
//! leader's first pass.
//!
//! Rotation without dropping requests: the new CA is added to `caBundle` beside the old one
//! before any replica serves a certificate it signed, and every replica reloads the Secret on a
//! timer and swaps the certificate it presents for new connections (in-flight ones finish on
//! the old one).
//!
//! What is decided here is pure ([`plan`]: what to keep, renew or make, from the stored
//! pair and the clock); the operator fetches the Secret, calls, and writes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::error::Error;

/// Key in the webhook's Secret for the current CA certificate (PEM), the first of `caBundle`.
pub const CA_CERT: &str = "ca.crt";
/// Key in the webhook's Secret for the CA's private key (PEM), which signs the serving certificate.
pub const CA_KEY: &str = "ca.key";
/// Key in the webhook's Secret for the serving certificate (PEM) the webhook presents.
pub const TLS_CERT: &str = "tls.crt";
/// Key in the webhook's Secret for the serving certificate's private key (PEM).
pub const TLS_KEY: &str = "tls.key";
/// Earlier CAs still trusted (PEM, concatenated): kept in `caBundle` until the certificates
/// they signed are gone.
pub const CA_PREVIOUS: &str = "ca-previous.crt";

/// How long a CA lives.
pub const CA_LIFETIME: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// How long a serving certificate lives.
pub const SERVING_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// Renew when less than this is left.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The PEM texts of a pair as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// [`CA_CERT`]: the CA certificate, PEM.
    pub ca_cert: String,
    /// [`CA_KEY`]: the CA's private key, PEM.
    pub ca_key: String,
    /// [`TLS_CERT`]: the webhook's serving certificate, PEM, signed by the CA.
    pub tls_cert: String,
    /// [`TLS_KEY`]: the serving certificate's private key, PEM.
    pub tls_key: String,
    /// [`CA_PREVIOUS`]: earlier CA certificates, PEM, still trusted after a rotation.
    pub ca_previous: String,
}

/// A Secret's data.
pub type Data = BTreeMap<String, Vec<u8>>;

fn data(entries: &[(&str, &String)]) -> Data {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect()
}

impl Stored {
    /// From the serving Secret's data and the CA Secret's (each CA key read from the CA Secret
    /// first, then from a serving Secret of the layout before the split).
    pub fn from_secrets(serving: &Data, ca: &Data) -> Stored {
        let text = |d: &Data, k: &str| {
            d.get(k)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .filter(|v| !v.is_empty())
        };
        let ca_text = |k: &str| text(ca, k).or_else(|| text(serving, k)).unwrap_or_default();
        Stored {
            ca_cert: ca_text(CA_CERT),
            ca_key: ca_text(CA_KEY),
            tls_cert: text(serving, TLS_CERT).unwrap_or_default(),
            tls_key: text(serving, TLS_KEY).unwrap_or_default(),
            ca_previous: ca_text(CA_PREVIOUS),
        }
    }

    /// The serving Secret's data: the pair and the CA certificate (no key).
    pub fn serving_data(&self) -> Data {
        data(&[
            (TLS_CERT, &self.tls_cert),
            (TLS_KEY, &self.tls_key),
            (CA_CERT, &self.ca_cert),
        ])
    }

    /// The CA Secret's data: the CA, its key and the earlier CAs still trusted.
    pub fn ca_data(&self) -> Data {
        data(&[
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (CA_PREVIOUS, &self.ca_previous),
        ])
    }

    /// What the webhook configurations trust: the current CA and the earlier ones.
    pub fn ca_bundle(&self) -> String {
        format!("{}{}", self.ca_cert, self.ca_previous)
    }
}

/// What one certificate says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Seconds since the epoch at which it expires.
    pub not_after: i64,
    /// Its DNS names and IP addresses.
    pub names: Vec<String>,
}

/// Reads a PEM certificate's expiry and names.
pub fn facts(pem: &str) -> Option<Facts> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => names.push((*d).to_owned()),
                x509_parser::extensions::GeneralName::IPAddress(ip) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*ip) {
                        names.push(std::net::Ipv4Addr::from(a).to_string());
                    } else if let Ok(a) = <[u8; 16]>::try_from(*ip) {
                        names.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Some(Facts {
        not_after: cert.validity().not_after.timestamp(),
        names,
    })
}

/// What to do with the stored pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Serve it as it is.
    Keep,
    /// Issue a new serving certificate from the stored CA (why).
    RenewServing(&'static str),
    /// Make a new CA (the old one stays trusted) and a serving certificate from it (why).
    NewCa(&'static str),
}

/// Decides from the stored pair, the names it must carry and the clock (seconds since the
/// epoch).
pub fn plan(stored: &Stored, names: &[String], now: i64) -> Plan {
    let renew = RENEW_BEFORE.as_secs() as i64;
    let Some(ca) = facts(&stored.ca_cert).filter(|_| !stored.ca_key.is_empty()) else {
        return Plan::NewCa("no CA is stored");
    };
    // A CA must outlive the serving certificate it signs.
    if ca.not_after - now < SERVING_LIFETIME.as_secs() as i64 + renew {
        return Plan::NewCa("the CA expires soon");
    }
    let Some(serving) = facts(&stored.tls_cert).filter(|_| !stored.tls_key.is_empty()) else {
        return Plan::RenewServing("no serving certificate is stored");
    };
    if serving.not_after - now < renew {
        return Plan::RenewServing("the serving certificate expires within 30 days");
    }
    if names.iter().any(|n| !serving.names.contains(n)) {
        return Plan::RenewServing(
            "the serving certificate lacks a name the webhook is reached by",
        );
    }
    Plan::Keep
}

/// Which Secrets the leading replica writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Writes {
    /// The CA Secret.
    pub ca: bool,
    /// The serving Secret.
    pub serving: bool,
}

/// What to write for `plan`, given what is stored now: a new CA goes to both Secrets, a new
/// serving pair to the serving one; a CA Secret that is missing or differs, and a serving
/// Secret that still holds the CA key (the layout before the split) or lacks the CA
/// certificate, are written even when the pair is kept.
pub fn writes(plan: &Plan, next: &Stored, serving: &Data, ca: &Data) -> Writes {
    let differs = |stored: &Data, want: &Data| want.iter().any(|(k, v)| stored.get(k) != Some(v));
    Writes {
        ca: matches!(plan, Plan::NewCa(_)) || differs(ca, &next.ca_data()),
        serving: !matches!(plan, Plan::Keep)
            || serving.contains_key(CA_KEY)
            || differs(serving, &next.serving_data()),
    }
}

fn distinguished(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::seconds(lifetime.as_secs() as i64);
}

/// Carries out a plan: the pair to store.
pub fn carry_out(plan: &Plan, stored: &Stored, names: &[String]) -> Result<Stored, Error> {
    let mut next = stored.clone();
    if let Plan::NewCa(_) = plan {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(Error::certificate)?;
        params.distinguished_name = distinguished("kvcache-operator webhook CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, CA_LIFETIME);
        let key = KeyPair::generate().map_err(Error::certificate)?;
        let cert = params.self_signed(&key).map_err(Error::certificate)?;
        // The old CA stays trusted until the certificates it signed are gone (one serving
        // lifetime); only the latest earlier CA is kept.
        next.ca_previous = if facts(&stored.ca_cert).is_some() {
            stored.ca_cert.clone()
        } else {
            String::new()
        };
        next.ca_cert = cert.pem();
        next.ca_key = key.serialize_pem();
    }
    if matches!(plan, Plan::Keep) {
        return Ok(next);
    }
    let ca_key = KeyPair::from_pem(&next.ca_key).map_err(Error::certificate)?;
    let issuer = Issuer::from_ca_cert_pem(&next.ca_cert, ca_key).map_err(Error::certificate)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(Error::certificate)?;
    params.distinguished_name = distinguished("kvcache-operator webhook");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, SERVING_LIFETIME);
    let key = KeyPair::generate().map_err(Error::certificate)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(Error::certificate)?;
    next.tls_cert = cert.pem();
    next.tls_key = key.serialize_pem();
    Ok(next)
}

/// The certificate the TLS server presents, swapped in place on renewal.
#[derive(Debug, Default)]
pub struct Presented {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// When the presented certificate expires, seconds since the epoch (0: none presented).
    not_after: std::sync::atomic::AtomicI64,
}

impl Presented {
    /// Presents this pair from now on (new connections).
    pub fn load(&self, stored: &Stored) -> Result<(), Error> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(stored.tls_cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(Error::certificate)?;
        let key =
            PrivateKeyDer::from_pem_slice(stored.tls_key.as_bytes()).map_err(Error::certificate)?;
        let key =
            rustls::crypto::ring::sign::any_supported_type(&key).map_err(Error::certificate)?;
        let pair = Arc::new(CertifiedKey::new(certs, key));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(pair);
        self.not_after.store(
            facts(&stored.tls_cert).map_or(0, |f| f.not_after),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    /// When the presented certificate expires, seconds since the epoch (0: none presented).
    pub fn not_after(&self) -> i64 {
        self.not_after.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a certificate is loaded (readiness).
    pub fn loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

impl ResolvesServerCert for Presented {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Keeps the stored pair current, the webhook configurations trusting it, and the presented
/// certificate loaded (the operator's side of this module: fetch, call [`plan`], write).
pub struct Keeper {
    pub client: kube::Client,
    /// The operator's namespace (where the Secret is).
    pub namespace: String,
    /// Name of the Secret in `namespace` that holds the serving pair (and the CA certificate).
    pub secret: String,
    /// Name of the Secret in `namespace` that holds the CA and its key.
    pub ca_secret: String,
    /// The webhook configurations' name (validating and mutating).
    pub configuration: String,
    /// The names the serving certificate carries.
    pub names: Vec<String>,
    /// What the TLS server presents.
    pub presented: Arc<Presented>,
    /// Whether this replica may write (it leads, or runs without leader election): a standby
    /// only reads the Secret and presents the pair the leader keeps.
    pub writer: tokio::sync::watch::Receiver<bool>,
}

/// How often every replica re-reads the Secret (and renews when due).
pub const RELOAD: Duration = Duration::from_secs(60);

impl Keeper {
    /// One pass: read, renew when due (another replica may have written first: then its pair
    /// is taken), trust, present; whether the webhook configurations trust what is presented.
    /// A standby reads the serving Secret alone; the leader reads the CA's too.
    pub async fn once(&self) -> Result<bool, Error> {
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::Api;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = format!("Secret {}/{}", self.namespace, self.secret);
        let ca_what = format!("Secret {}/{}", self.namespace, self.ca_secret);
        let read = |s: &Option<Secret>| -> Data {
            s.as_ref()
                .and_then(|s| s.data.as_ref())
                .map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
                .unwrap_or_default()
        };
        for _ in 0..3 {
            let writer = *self.writer.borrow();
            let serving = api
                .get_opt(&self.secret)
                .await
                .map_err(crate::error::kube("get", what.clone()))?;
            let ca = if writer {
                api.get_opt(&self.ca_secret)
                    .await
                    .map_err(crate::error::kube("get", ca_what.clone()))?
            } else {
                None
            };
            let (serving_data, ca_data) = (read(&serving), read(&ca));
            let stored = Stored::from_secrets(&serving_data, &ca_data);
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            let decided = plan(&stored, &self.names, now);
            let pair = if !writer {
                // A standby serves what is stored, even when due (the leader renews it and
                // this replica presents the new pair on the Secret's next event).
                if stored.tls_cert.is_empty() || stored.tls_key.is_empty() {
                    return Err(Error::Certificate(
                        format!("{what} holds no serving pair yet: the leading replica writes it")
                            .into(),
                    ));
                }
                stored
            } else {
                let next = if decided == Plan::Keep {
                    stored
                } else {
                    carry_out(&decided, &stored, &self.names)?
                };
                let due = writes(&decided, &next, &serving_data, &ca_data);
                // The CA first: a serving pair is never stored before the CA that signed it.
                let written = async {
                    if due.ca {
                        self.write(&api, &self.ca_secret, ca.as_ref(), "Opaque", next.ca_data())
                            .await
                            .map_err(|e| (ca_what.clone(), e))?;
                    }
                    if due.serving {
                        self.write(
                            &api,
                            &self.secret,
                            serving.as_ref(),
                            "kubernetes.io/tls",
                            next.serving_data(),
                        )
                        .await
                        .map_err(|e| (what.clone(), e))?;
                    }
                    Ok::<(), (String, kube::Error)>(())
                };
                match written.await {
                    Ok(()) => {
                        if due != Writes::default() {
                            tracing::info!(why = ?decided, ?due, "webhook certificate written");
                        }
                        next
                    }
                    // Another replica wrote first: take its pair.
                    Err((_, kube::Error::Api(s))) if s.code == 409 => continue,
                    Err((which, e)) => return Err(crate::error::kube("write", which)(e)),
                }
            };
            // Trust first, then present: a new CA is in caBundle before anything it signed
            // is served.
            // A standby only reads: it is ready once the configurations trust its CA (the
            // leader writes caBundle), so that the Service never sends the API server to a
            // replica whose certificate it cannot verify yet.
            let trusted = self.trust(&pair.ca_bundle(), &pair.ca_cert, writer).await?;
            self.presented.load(&pair)?;
            return Ok(trusted);
        }
        Err(Error::Certificate(
            format!("{what} kept changing under three attempts to write it").into(),
        ))
    }

    /// Creates the Secret `name` or replaces `current` (at its resource version, so that a
    /// write that races another replica's is refused with a conflict) with `data`.
    async fn write(
        &self,
        api: &kube::Api<k8s_openapi::api::core::v1::Secret>,
        name: &str,
        current: Option<&k8s_openapi::api::core::v1::Secret>,
        type_: &str,
        data: Data,
    ) -> Result<(), kube::Error> {
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::{ObjectMeta, PostParams};
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                resource_version: current.and_then(|c| c.metadata.resource_version.clone()),
                labels: Some(BTreeMap::from([(
                    kvcache_render::names::MANAGED_BY_LABEL.to_owned(),
                    kvcache_render::names::OPERATOR.to_owned(),
                )])),
                ..Default::default()
            },
            // A Secret's type cannot change: one from before keeps its own.
            type_: Some(
                current
                    .and_then(|c| c.type_.clone())
                    .unwrap_or_else(|| type_.to_owned()),
            ),
            data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
            ..Default::default()
        };
        match current {
            Some(_) => api.replace(name, &PostParams::default(), &secret).await?,
            None => api.create(&PostParams::default(), &secret).await?,
        };
        Ok(())
    }

    /// Writes `bundle` into every webhook of the validating and mutating configurations (those
    /// that exist; a missing one is not ours to create).
    async fn trust(&self, bundle: &str, ca: &str, write: bool) -> Result<bool, Error> {
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
        };
        fn validating(c: &mut ValidatingWebhookConfiguration) -> Vec<&mut WebhookClientConfig> {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        }
        fn mutating(c: &mut MutatingWebhookConfiguration) -> Vec<&mut WebhookClientConfig> {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        }
        let v = self.trust_in(bundle, ca, write, validating).await?;
        let m = self.trust_in(bundle, ca, write, mutating).await?;
        Ok(v && m)
    }

    /// [`Keeper::trust`] for one kind of configuration, whose client configs `hooks` lists:
    /// with `write`, makes every `caBundle` the bundle; without, only says whether every one
    /// already trusts `ca` (a configuration that does not exist asks for no trust).
    async fn trust_in<K>(
        &self,
        bundle: &str,
        ca: &str,
        write: bool,
        hooks: fn(
            &mut K,
        )
            -> Vec<&mut k8s_openapi::api::admissionregistration::v1::WebhookClientConfig>,
    ) -> Result<bool, Error>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        use k8s_openapi::ByteString;
        use kube::api::{Api, PostParams};
        let want = ByteString(bundle.as_bytes().to_vec());
        let api: Api<K> = Api::all(self.client.clone());
        let what = format!("webhook configuration {}", self.configuration);
        let Some(mut c) = api
            .get_opt(&self.configuration)
            .await
            .map_err(crate::error::kube("get", what.clone()))?
        else {
            return Ok(true);
        };
        let configs = hooks(&mut c);
        if !write {
            let ca = ca.trim();
            return Ok(configs.iter().all(|h| {
                h.ca_bundle
                    .as_ref()
                    .is_some_and(|b| String::from_utf8_lossy(&b.0).contains(ca))
            }));
        }
        if configs.iter().all(|h| h.ca_bundle.as_ref() == Some(&want)) {
            return Ok(true);
        }
        for h in configs {
            h.ca_bundle = Some(want.clone());
        }
        api.replace(&self.configuration, &PostParams::default(), &c)
            .await
            .map_err(crate::error::kube("update", what))?;
        Ok(true)
    }

    /// Runs [`Keeper::once`] now, whenever the Secret changes (another replica renewed it:
    /// every replica presents the new pair within a watch event) or a webhook configuration
    /// does (one applied afresh gets its `caBundle` at once) and every [`RELOAD`] (expiry
    /// comes with the clock, not with an event), until the task is dropped; `ready` is set once
    /// a certificate is presented.
    pub async fn run(self, ready: Arc<crate::telemetry::Readiness>) {
        use futures::StreamExt;
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
        };
        use k8s_openapi::api::core::v1::Secret;
        use kube::runtime::{WatchStreamExt, watcher};
        let secret = watcher::Config::default().fields(&format!("metadata.name={}", self.secret));
        let configuration =
            watcher::Config::default().fields(&format!("metadata.name={}", self.configuration));
        // Any change to the Secret or to either configuration (one applied afresh comes
        // without caBundle) starts a pass; what the event was does not matter.
        let mut changes = futures::stream::select_all([
            watcher(
                kube::Api::<Secret>::namespaced(self.client.clone(), &self.namespace),
                secret,
            )
            .default_backoff()
            .map(|e| e.map(drop))
            .boxed(),
            watcher(
                kube::Api::<ValidatingWebhookConfiguration>::all(self.client.clone()),
                configuration.clone(),
            )
            .default_backoff()
            .map(|e| e.map(drop))
            .boxed(),
            watcher(
                kube::Api::<MutatingWebhookConfiguration>::all(self.client.clone()),
                configuration,
            )
            .default_backoff()
            .map(|e| e.map(drop))
            .boxed(),
        ]);
        let mut watching = true;
        let mut writer = self.writer.clone();
        loop {
            match self.once().await {
                Ok(trusted) => ready
                    .webhook
                    .store(trusted, std::sync::atomic::Ordering::Relaxed),
                Err(e) => tracing::warn!(error = %e, "webhook certificate"),
            }
            ready.certificate_not_after.store(
                self.presented.not_after(),
                std::sync::atomic::Ordering::Relaxed,
            );
            let wait = tokio::time::sleep(if self.presented.loaded() {
                RELOAD
            } else {
                Duration::from_secs(2)
            });
            tokio::select! {
                () = wait => {}
                // Becoming the leader: write what is due at once.
                Ok(()) = writer.changed() => {}
                event = changes.next(), if watching => match event {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::debug!(error = %e, "watching the webhook Secret and configurations"),
                    None => watching = false,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
